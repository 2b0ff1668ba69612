//! Tenant ownership: which buckets and prefixes each tenant's jobs may read and write. With a
//! tenants file (`tenants_file`), every job is checked before anything is read or written: its
//! tenant (named in the job message, or implied by the one tenant whose inputs hold the
//! input) must own both the input and the result location. A job that fails the check touches
//! no storage (a failure record would be a write where it may not write): it is counted as a
//! `tenant_violation` failure and its message goes back to the queue until the dead-letter
//! policy takes it, which the dead-letter alarm reports.
//!
//! ```toml
//! [tenants.acme]
//! inputs = ["s3://acme-recordings/"]
//! outputs = ["s3://acme-transcripts/parakeet/"]
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::{DispatchError, Result};
use crate::job::{ObjectRef, Prefix};

/// What one tenant owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub inputs: Vec<Prefix>,
    pub outputs: Vec<Prefix>,
}

/// Every tenant, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tenants(BTreeMap<String, Tenant>);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tenants: BTreeMap<String, TenantFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantFile {
    inputs: Vec<String>,
    outputs: Vec<String>,
}

impl Tenants {
    /// Reads and checks a tenants file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| DispatchError::io(path, e))?;
        Self::parse(&text).map_err(|e| match e {
            DispatchError::Config(why) => {
                DispatchError::Config(format!("tenants file {}: {why}", path.display()))
            }
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<Self> {
        let file: File = toml::from_str(text).map_err(|e| DispatchError::Config(e.to_string()))?;
        // An owned prefix is a folder: `acme` owns `acme/...`, not `acme-evil/...`.
        let folder = |uri: &String| {
            Prefix::parse_uri(uri).map(|mut p| {
                if !p.prefix.is_empty() && !p.prefix.ends_with('/') {
                    p.prefix.push('/');
                }
                p
            })
        };
        let prefixes = |uris: &[String]| uris.iter().map(folder).collect::<Result<Vec<_>>>();
        let mut tenants = BTreeMap::new();
        for (name, t) in file.tenants {
            if t.inputs.is_empty() || t.outputs.is_empty() {
                return Err(DispatchError::Config(format!(
                    "tenant `{name}` needs at least one `inputs` and one `outputs` prefix"
                )));
            }
            let tenant = Tenant {
                inputs: prefixes(&t.inputs)?,
                outputs: prefixes(&t.outputs)?,
            };
            tenants.insert(name, tenant);
        }
        Ok(Self(tenants))
    }

    /// The tenant the job runs as: the one it names, else the one whose inputs hold its input
    /// (exactly one), and its checks: it owns `input` and `output`.
    pub fn check(&self, named: Option<&str>, input: &ObjectRef, output: &Prefix) -> Result<String> {
        let violation = |why: String| Err(DispatchError::TenantViolation { why });
        let name = match named {
            Some(name) => name.to_owned(),
            None => {
                let owners: Vec<&String> = (self.0.iter())
                    .filter(|(_, t)| t.inputs.iter().any(|p| holds(p, input)))
                    .map(|(name, _)| name)
                    .collect();
                match owners.as_slice() {
                    [one] => (*one).clone(),
                    [] => return violation(format!("no tenant owns {}", input.uri())),
                    many => {
                        return violation(format!(
                        "{} belongs to several tenants ({many:?}): the job must name its tenant",
                        input.uri()
                    ))
                    }
                }
            }
        };
        let Some(tenant) = self.0.get(&name) else {
            return violation(format!("unknown tenant `{name}`"));
        };
        if !tenant.inputs.iter().any(|p| holds(p, input)) {
            return violation(format!("tenant `{name}` does not own {}", input.uri()));
        }
        if !tenant.outputs.iter().any(|p| within(p, output)) {
            return violation(format!("tenant `{name}` does not own {}", output.uri()));
        }
        Ok(name)
    }
}

fn holds(owned: &Prefix, object: &ObjectRef) -> bool {
    owned.bucket == object.bucket && object.key.starts_with(&owned.prefix)
}

fn within(owned: &Prefix, prefix: &Prefix) -> bool {
    owned.bucket == prefix.bucket && prefix.prefix.starts_with(&owned.prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants() -> Tenants {
        Tenants::parse(
            r#"
            [tenants.acme]
            inputs = ["s3://shared-in/acme/", "s3://acme-in/"]
            outputs = ["s3://out/acme/"]
            [tenants.globex]
            inputs = ["s3://shared-in/globex/"]
            outputs = ["s3://out/globex/"]
            "#,
        )
        .expect("tenants")
    }

    fn out(uri: &str) -> Prefix {
        Prefix::parse_uri(uri).expect("prefix")
    }

    #[test]
    fn a_job_runs_as_the_tenant_that_owns_its_input_and_output() {
        let t = tenants();
        let input = ObjectRef::new("shared-in", "acme/call.wav");
        assert_eq!(
            t.check(None, &input, &out("s3://out/acme/x/")).ok(),
            Some("acme".into())
        );
        assert_eq!(
            t.check(
                Some("acme"),
                &ObjectRef::new("acme-in", "a.wav"),
                &out("s3://out/acme/")
            )
            .ok(),
            Some("acme".into())
        );
    }

    #[test]
    fn every_way_out_of_a_tenants_space_is_a_violation() {
        let t = tenants();
        let acme_in = ObjectRef::new("shared-in", "acme/call.wav");
        let cases = [
            // another tenant's input, named or implied
            (
                Some("acme"),
                ObjectRef::new("shared-in", "globex/c.wav"),
                "s3://out/acme/",
            ),
            // nobody's input
            (None, ObjectRef::new("elsewhere", "c.wav"), "s3://out/acme/"),
            // another tenant's output
            (None, acme_in.clone(), "s3://out/globex/"),
            // a prefix that only starts like the owned one is not inside it
            (None, acme_in.clone(), "s3://out/acme-evil/"),
            (Some("nobody"), acme_in, "s3://out/acme/"),
        ];
        for (named, input, output) in cases {
            let e = t.check(named, &input, &out(output)).expect_err(output);
            assert_eq!(e.reason_code(), "tenant_violation", "{e}");
        }
    }

    #[test]
    fn a_tenant_needs_inputs_and_outputs() {
        let e = Tenants::parse("[tenants.x]\ninputs = []\noutputs = [\"s3://o/\"]\n")
            .expect_err("no inputs");
        assert!(e.to_string().contains("tenant `x`"), "{e}");
    }
}
