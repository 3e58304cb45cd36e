//! Webhooks the simulated provider sends about its jobs: the honest announcement when a job ends,
//! and on request the ones a receiver must shrug off (duplicates, an early "succeeded" while the job
//! runs, a forged signature, a stale timestamp). Signed with Standard Webhooks or a plain HMAC
//! header, as the receiving contract expects.

use std::time::Duration;

use hmac::{KeyInit, Mac};
use serde::Serialize;

use crate::Sim;
use crate::script::Script;

/// Where the simulator sends webhooks, and how it signs them.
#[derive(Debug, Clone)]
pub struct Target {
    /// The receiver (jobtrail's `/v1/webhooks/{provider}`).
    pub url: String,
    pub signing: Signing,
}

#[derive(Debug, Clone)]
pub enum Signing {
    /// Standard Webhooks with this `whsec_…` secret.
    Standard { secret: String },
    /// A hex HMAC-SHA256 of the body in `header`.
    Hmac { secret: String, header: String },
}

/// One delivery, as the ledger records it.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    pub event_id: String,
    pub job_id: String,
    /// What the delivery was: `finish`, `duplicate`, `early`, `forged`, `stale`, `progress`.
    pub kind: String,
    pub claimed_state: String,
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    pub at: chrono::DateTime<chrono::Utc>,
}

/// Plan and send a job's deliveries in the background.
pub(crate) fn spawn(sim: Sim, target: Target, job_id: String, script: &Script) {
    let plan = script.webhooks.clone();
    let duration = (!script.never_finish).then(|| Duration::from_millis(script.duration_ms));
    tokio::spawn(async move {
        // reqwest without a built-in crypto provider needs one installed (a no-op if it is).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let Ok(client) = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
        else {
            return;
        };
        let send =
            |kind: &'static str, event_id: String, state: String, age_secs: i64, key_ok: bool| {
                let (client, sim, target, job_id) =
                    (client.clone(), sim.clone(), target.clone(), job_id.clone());
                async move {
                    let body = serde_json::json!({
                        "event_id": event_id,
                        "type": "job.state_changed",
                        "job_id": job_id,
                        "state": state,
                    });
                    let body = serde_json::to_vec(&body).unwrap_or_default();
                    let status =
                        deliver(&client, &target, &event_id, &body, age_secs, key_ok).await;
                    sim.record_webhook(Sent {
                        event_id,
                        job_id,
                        kind: kind.to_owned(),
                        claimed_state: state,
                        status,
                        at: chrono::Utc::now(),
                    });
                }
            };
        if plan.early {
            send(
                "early",
                format!("evt_{job_id}_early"),
                "succeeded".into(),
                0,
                true,
            )
            .await;
        }
        if plan.forged {
            send(
                "forged",
                format!("evt_{job_id}_forged"),
                "succeeded".into(),
                0,
                false,
            )
            .await;
        }
        // A provider that will not stop: "still running" under a new event id, again and again,
        // while the job runs (beside the end announcement, not before it).
        let flood = async {
            for n in 0..plan.flood {
                let event = format!("evt_{job_id}_p{n}");
                send("progress", event, "running".into(), 0, true).await;
                tokio::time::sleep(Duration::from_millis(plan.flood_every_ms)).await;
            }
        };
        let end = async {
            let Some(d) = duration else { return };
            if !(plan.on_finish || plan.duplicates > 0 || plan.stale) {
                return;
            }
            tokio::time::sleep(d + Duration::from_millis(50)).await;
            let state = sim.job_state(&job_id);
            let end = format!("evt_{job_id}_end");
            if plan.on_finish {
                send("finish", end.clone(), state.clone(), 0, true).await;
            }
            for _ in 0..plan.duplicates {
                send("duplicate", end.clone(), state.clone(), 0, true).await;
            }
            if plan.stale {
                send("stale", format!("evt_{job_id}_stale"), state, 3600, true).await;
            }
        };
        tokio::join!(flood, end);
    });
}

/// Sign and POST one delivery; the receiver's status, if it answered.
async fn deliver(
    client: &reqwest::Client,
    target: &Target,
    event_id: &str,
    body: &[u8],
    age_secs: i64,
    key_ok: bool,
) -> Option<u16> {
    let mut req = client
        .post(&target.url)
        .header("content-type", "application/json");
    match &target.signing {
        Signing::Standard { secret } => {
            let secret = if key_ok {
                secret.clone()
            } else {
                // A well-formed key, but not the receiver's.
                "whsec_Zm9yZ2VkLWtleS1mb3JnZWQta2V5LWZvcmdlZC1rZXk=".to_owned()
            };
            let wh = standardwebhooks::Webhook::new(&secret).ok()?;
            let ts = chrono::Utc::now().timestamp() - age_secs;
            let sig = wh.sign(event_id, ts, body).ok()?;
            req = req
                .header(standardwebhooks::HEADER_WEBHOOK_ID, event_id)
                .header(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP, ts.to_string())
                .header(standardwebhooks::HEADER_WEBHOOK_SIGNATURE, sig);
        }
        Signing::Hmac { secret, header } => {
            let key = if key_ok { secret.as_bytes() } else { b"forged" };
            let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).ok()?;
            mac.update(body);
            let sig = hex::encode(mac.finalize().into_bytes());
            req = req.header(header.as_str(), format!("sha256={sig}"));
        }
    }
    req.body(body.to_vec())
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16())
}

impl Sim {
    fn record_webhook(&self, sent: Sent) {
        if let Ok(mut g) = self.inner.lock() {
            g.ledger.webhooks.push(sent);
        }
    }

    fn job_state(&self, id: &str) -> String {
        let g = self.inner.lock().expect("sim lock");
        g.jobs
            .get(id)
            .map(|j| j.phase(tokio::time::Instant::now()).0.to_owned())
            .unwrap_or_else(|| "unknown".into())
    }
}
