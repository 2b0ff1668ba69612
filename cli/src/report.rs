//! An error chain as one line with each cause once. Many of our errors (and the libraries')
//! write their source into their own message and also return it as `source()`; printing the
//! chain naively repeats a cause two or three times.

use std::error::Error;

/// `error`'s messages, outermost first, joined by `: `, leaving out a message that another one
/// in the chain already contains.
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut messages: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        messages.push(e.to_string().trim().to_owned());
        next = e.source();
    }
    let kept: Vec<&str> = messages
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            !m.is_empty()
                && !messages.iter().enumerate().any(|(j, other)| {
                    // Contained in another message: said there. Equal messages keep the first.
                    j != *i && other.contains(m.as_str()) && (other != *m || j < *i)
                })
        })
        .map(|(_, m)| m.as_str())
        .collect();
    kept.join(": ")
}

/// Prints `error` on stderr as `error: ...` (one line, each cause once) and gives the failure
/// exit status: what every binary's `main` does with an error that stopped it.
pub fn exit_failure(error: &(dyn Error + 'static)) -> std::process::ExitCode {
    eprintln!("error: {}", one_line(error));
    std::process::ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(String, Option<Box<E>>);

    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl Error for E {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    fn chain(messages: &[&str]) -> E {
        messages
            .iter()
            .rev()
            .fold(None, |inner, m| Some(E(m.to_string(), inner.map(Box::new))))
            .expect("one message")
    }

    #[test]
    fn each_cause_once() {
        // The chain `dispatcher transcribe --model /nonexist.nemo` printed before.
        let e = chain(&[
            "loading model /x.nemo",
            "loading model /x.nemo: /x.nemo: No such file or directory (os error 2)",
            "/x.nemo: No such file or directory (os error 2)",
            "No such file or directory (os error 2)",
        ]);
        assert_eq!(
            one_line(&e),
            "loading model /x.nemo: /x.nemo: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn distinct_causes_are_joined() {
        let e = chain(&[
            "starting the fleet",
            "worker 0 exited",
            "model file missing",
        ]);
        assert_eq!(
            one_line(&e),
            "starting the fleet: worker 0 exited: model file missing"
        );
        let twice = chain(&["bad value", "bad value"]);
        assert_eq!(one_line(&twice), "bad value");
    }
}
