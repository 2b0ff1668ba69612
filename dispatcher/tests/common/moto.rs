//! A moto_server for the whole test binary: `MOTO_ENDPOINT` if set, otherwise one started on a
//! free 127.0.0.1 port. The server runs under a small shell that kills it when our stdin pipe
//! closes, i.e. when the test process exits (however it exits).

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub struct Moto {
    pub endpoint: String,
    _child: Option<Mutex<Child>>,
}

static MOTO: OnceLock<Moto> = OnceLock::new();

pub fn moto() -> &'static Moto {
    MOTO.get_or_init(|| {
        if let Ok(endpoint) = std::env::var("MOTO_ENDPOINT") {
            return Moto {
                endpoint,
                _child: None,
            };
        }
        start()
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

fn start() -> Moto {
    let port = free_port();
    let script = format!(
        "moto_server -H 127.0.0.1 -p {port} >/dev/null 2>&1 & pid=$!; \
         echo started; cat >/dev/null; kill $pid 2>/dev/null; wait $pid 2>/dev/null"
    );
    let found = Command::new("sh")
        .arg("-c")
        .arg("command -v moto_server")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        found,
        "moto_server is not on PATH: install it with `pip install 'moto[server]'` \
         or point MOTO_ENDPOINT at a running one"
    );
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning sh for moto_server");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("moto wrapper output");
    let endpoint = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto_server did not listen on {endpoint} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Moto {
        endpoint,
        _child: Some(Mutex::new(child)),
    }
}

/// SDK configuration for moto (static test credentials, us-east-1).
pub async fn sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&moto().endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            "testing", "testing", None, None, "static",
        ))
        .load()
        .await
}
