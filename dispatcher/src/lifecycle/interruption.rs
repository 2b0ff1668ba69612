//! Interruption notices from the EC2 instance metadata service (IMDSv2): a Spot interruption
//! (`spot/instance-action`, about two minutes ahead of the stop) or the Auto Scaling group
//! terminating this instance (`autoscaling/target-lifecycle-state` becomes `Terminated` while
//! the group's termination lifecycle hook holds it). Either one stops receiving and drains:
//! jobs in flight finish if they can before the notice's time, less [`RELEASE_MARGIN`], and
//! the rest are released for other nodes.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_config::imds::client::error::ImdsError;
use aws_sdk_sqs::primitives::{DateTime, DateTimeFormat};
use tokio_util::sync::CancellationToken;

use super::Consumer;
use crate::error::{DispatchError, Result};

/// Kept free before a Spot stop for releasing what did not finish.
pub const RELEASE_MARGIN: Duration = Duration::from_secs(10);
/// What AWS promises between a Spot notice and the stop, used when the notice has no time.
const SPOT_NOTICE: Duration = Duration::from_secs(120);

const SPOT_PATH: &str = "/latest/meta-data/spot/instance-action";
const LIFECYCLE_PATH: &str = "/latest/meta-data/autoscaling/target-lifecycle-state";

/// Why this instance is going away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A Spot interruption: `action` is `terminate`, `stop` or `hibernate`, at `at`.
    Spot {
        action: String,
        at: Option<SystemTime>,
    },
    /// The Auto Scaling group is terminating the instance (scale-in, rebalancing, health).
    ScaleIn,
}

impl Notice {
    /// When in-flight work must be done by: the Spot time less the release margin; for a
    /// scale-in none (the lifecycle hook waits longer than the drain grace).
    pub fn drain_by(&self, now: Instant, wall_now: SystemTime) -> Option<Instant> {
        match self {
            Self::Spot { at, .. } => {
                let left = match at {
                    Some(at) => at.duration_since(wall_now).unwrap_or_default(),
                    None => SPOT_NOTICE,
                };
                Some(now + left.saturating_sub(RELEASE_MARGIN))
            }
            Self::ScaleIn => None,
        }
    }
}

/// IMDSv2 (a session token per request series, as EC2 requires by default), through the AWS
/// SDK's own client.
pub struct InstanceMetadata {
    client: aws_config::imds::Client,
}

impl InstanceMetadata {
    /// The service at `url` (`http://169.254.169.254` on EC2).
    pub fn new(url: &str) -> Result<Self> {
        let client = aws_config::imds::Client::builder()
            .endpoint(url)
            .map_err(|e| {
                DispatchError::Config(format!(
                    "instance_metadata_url `{url}` is not a usable URL ({e}); give one like http://169.254.169.254"
                ))
            })?
            .max_attempts(2)
            .connect_timeout(Duration::from_secs(1))
            .read_timeout(Duration::from_secs(2))
            .build();
        Ok(Self { client })
    }

    /// A notice if the instance has one now.
    pub async fn poll(&self) -> Result<Option<Notice>> {
        if let Some(body) = self.get(SPOT_PATH).await? {
            return Ok(Some(parse_spot(&body)));
        }
        Ok(match self.get(LIFECYCLE_PATH).await? {
            Some(state) if state.trim() == "Terminated" => Some(Notice::ScaleIn),
            _ => None,
        })
    }

    /// The document at `path`; `None` when the service has none (404: no notice, or an
    /// instance outside an Auto Scaling group).
    async fn get(&self, path: &str) -> Result<Option<String>> {
        match self.client.get(path).await {
            Ok(body) => Ok(Some(body.as_ref().to_owned())),
            Err(ImdsError::ErrorResponse(e)) if e.response().status().as_u16() == 404 => Ok(None),
            Err(e) => Err(DispatchError::InstanceMetadata {
                path: path.to_owned(),
                message: crate::aws::error_chain(&e),
            }),
        }
    }
}

/// `{"action": "terminate", "time": "2026-12-03T20:00:00Z"}`; what cannot be read still
/// counts as a notice (an unreadable notice is still the instance going away).
fn parse_spot(body: &str) -> Notice {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    let action = value["action"].as_str().unwrap_or("unknown").to_owned();
    let at = value["time"]
        .as_str()
        .and_then(|t| DateTime::from_str(t, DateTimeFormat::DateTime).ok())
        .and_then(|t| SystemTime::try_from(t).ok());
    Notice::Spot { action, at }
}

/// Polls every `every` until `stop` fires; on a notice, stops the consumer with the notice's
/// deadline and returns it. Failed polls are logged (the first and every 60th) and retried.
pub async fn watch(
    metadata: InstanceMetadata,
    consumer: Arc<Consumer>,
    stop: CancellationToken,
    every: Duration,
) -> Option<Notice> {
    let mut failures = 0u64;
    loop {
        match metadata.poll().await {
            Ok(Some(notice)) => {
                let drain_by = notice.drain_by(Instant::now(), SystemTime::now());
                tracing::warn!(
                    ?notice,
                    drain_s =
                        drain_by.map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64()),
                    "interruption notice: stop receiving, finish what fits, release the rest"
                );
                match drain_by {
                    Some(deadline) => consumer.stop_by(&stop, deadline),
                    None => stop.cancel(),
                }
                return Some(notice);
            }
            Ok(None) => failures = 0,
            Err(e) => {
                if failures.is_multiple_of(60) {
                    tracing::warn!(error = %e, failures = failures + 1,
                        "instance metadata poll failed; still watching");
                }
                failures += 1;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spot_notice_drains_until_its_time_less_the_margin() {
        let notice = parse_spot(r#"{"action": "terminate", "time": "2026-12-03T20:02:00Z"}"#);
        let wall = SystemTime::try_from(
            DateTime::from_str("2026-12-03T20:00:00Z", DateTimeFormat::DateTime).expect("time"),
        )
        .expect("system time");
        let now = Instant::now();
        assert!(matches!(&notice, Notice::Spot { action, at: Some(_) } if action == "terminate"));
        assert_eq!(
            notice.drain_by(now, wall),
            Some(now + SPOT_NOTICE - RELEASE_MARGIN)
        );
        // Past its time: nothing left to finish, release at once.
        let late = wall + Duration::from_secs(600);
        assert_eq!(notice.drain_by(now, late), Some(now));
    }

    #[test]
    fn an_unreadable_notice_still_counts() {
        let notice = parse_spot("not json");
        assert_eq!(
            notice,
            Notice::Spot {
                action: "unknown".into(),
                at: None
            }
        );
        let now = Instant::now();
        assert_eq!(
            notice.drain_by(now, SystemTime::now()),
            Some(now + SPOT_NOTICE - RELEASE_MARGIN)
        );
        assert_eq!(Notice::ScaleIn.drain_by(now, SystemTime::now()), None);
    }
}
