//! The drain itself: list the node's pods, evict every pod the step must move (through the Eviction API,
//! PodDisruptionBudgets honoured) and wait until they are gone, until the caller's deadline.

use std::collections::{BTreeMap, BTreeSet};

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use tokio::time::Instant;

use crate::decide::{
    self, DrainOptions, PodFacts, Verdict, Waiting, bound, name_pods, pdb_from_refusal,
    progress_text,
};
use crate::drainer::{
    DrainError, DrainSummary, Drainer, MAX_EVICTION_ANSWER_BYTES, MAX_PODS_LISTED,
    MAX_PODS_PER_PAGE, api_error, is_not_found,
};

/// How the API answered one eviction.
enum EvictionAnswer {
    /// The pod is being evicted.
    Accepted,
    /// The pod no longer exists.
    Gone,
    /// Not now: why the pod still waits.
    Refused(Waiting),
}

impl Drainer {
    /// The pods bound to the node now (a list by `fieldSelector=spec.nodeName=<node>`, paged, at most
    /// [`MAX_PODS_LISTED`]), as facts: what the drain decides from, and what the agent's node verification
    /// records before the drain and looks at after the update.
    pub async fn list_pods(&self) -> Result<Vec<PodFacts>, DrainError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let mut params = ListParams::default()
            .fields(&format!("spec.nodeName={}", self.node))
            .limit(MAX_PODS_PER_PAGE);
        let mut facts = Vec::new();
        loop {
            let page = self
                .retrying(|| pods.list(&params))
                .await
                .map_err(api_error(format!("list pods on {}", self.node)))?;
            facts.extend(page.items.iter().map(PodFacts::from_pod));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() && facts.len() < MAX_PODS_LISTED => {
                    params = params.continue_token(&token);
                }
                _ => break,
            }
        }
        Ok(facts)
    }

    /// True when the pod `key` with `uid` no longer exists (404, or the name now has another uid).
    async fn pod_gone(&self, pod: &PodFacts) -> Result<bool, DrainError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &pod.namespace);
        match self.retrying(|| pods.get(&pod.name)).await {
            Ok(found) => Ok(found.metadata.uid.as_deref() != Some(pod.uid.as_str())),
            Err(e) if is_not_found(&e) => Ok(true),
            // The node authorizer answers a node's get of a pod no longer bound to it with 403, not 404
            // (AuthorizeNodeWithSelectors): the node's own pod list then tells whether it is still there.
            Err(kube::Error::Api(r)) if r.code == 403 => Ok(!self
                .list_pods()
                .await?
                .iter()
                .any(|listed| listed.uid == pod.uid)),
            Err(e) => Err(api_error(format!("get pod {}", pod.key()))(e)),
        }
    }

    async fn evict(&self, pod: &PodFacts) -> Result<EvictionAnswer, DrainError> {
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/eviction",
            pod.namespace, pod.name
        );
        let body = serde_json::json!({
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        });
        let what = format!("evict pod {}", pod.key());
        let request = http::Request::post(path)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(kube::client::Body::from(body.to_string().into_bytes()))
            .map_err(|e| api_error(what.clone())(kube::Error::HttpError(e)))?;
        let response = self
            .client
            .send(request)
            .await
            .map_err(api_error(what.clone()))?;
        let status = response.status().as_u16();
        let limited = http_body_util::Limited::new(response.into_body(), MAX_EVICTION_ANSWER_BYTES);
        let bytes = match limited.collect().await {
            Ok(collected) => collected.to_bytes(),
            // An unreadable answer body: its status code still decides.
            Err(_) => Default::default(),
        };
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let message = answer["message"].as_str().unwrap_or("").to_owned();
        let causes: Vec<String> = answer["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["message"].as_str().map(str::to_owned))
            .collect();
        Ok(match status {
            200..=299 => EvictionAnswer::Accepted,
            404 => EvictionAnswer::Gone,
            429 => EvictionAnswer::Refused(Waiting::Pdb(
                pdb_from_refusal(&pod.namespace, &causes)
                    .unwrap_or_else(|| bound(format!("({message})"))),
            )),
            500 if message.contains("more than one PodDisruptionBudget") => {
                EvictionAnswer::Refused(Waiting::MultiplePdbs(pod.key()))
            }
            _ => EvictionAnswer::Refused(Waiting::Other(bound(format!("{status} {message}")))),
        })
    }

    /// Evicts every pod the step must move off the node (see [`decide`]) and waits until they are
    /// gone, until `deadline`. Refused evictions (429 PDB, 500 multiple PDBs, other errors) are
    /// asked again after the retry interval, never replaced by a delete. `progress` gets a text
    /// whenever it changes. Does not cordon: call [`Drainer::cordon`] first.
    pub async fn drain(
        &self,
        options: DrainOptions,
        deadline: Instant,
        progress: &mut (dyn FnMut(String) + Send),
    ) -> Result<DrainSummary, DrainError> {
        let mut summary = DrainSummary::default();
        // uid -> pod, for pods whose eviction the API accepted.
        let mut evicted: BTreeMap<String, PodFacts> = BTreeMap::new();
        // uid -> when a refused eviction may be asked again.
        let mut retry_at: BTreeMap<String, Instant> = BTreeMap::new();
        let mut waiting: Option<Waiting> = None;
        let mut last_text = String::new();
        loop {
            let pods = self.list_pods().await?;
            let acted = decide::plan(&pods, options);
            let blocked: Vec<String> = acted
                .iter()
                .filter_map(|(p, v)| match v {
                    Verdict::Block(reason) => {
                        Some(format!("{} needs {}", p.key(), reason.option()))
                    }
                    _ => None,
                })
                .collect();
            if !blocked.is_empty() {
                return Err(DrainError::Blocked {
                    node: self.node.clone(),
                    pods: name_pods(&blocked),
                });
            }
            let mut remaining = Vec::new();
            let mut refused_now: Option<Waiting> = None;
            for (pod, verdict) in &acted {
                if evicted.contains_key(&pod.uid) {
                    if !self.pod_gone(pod).await? {
                        remaining.push(pod.key());
                    }
                    continue;
                }
                if *verdict == Verdict::WaitDeleting {
                    remaining.push(pod.key());
                    continue;
                }
                let now = Instant::now();
                if retry_at.get(&pod.uid).is_some_and(|at| *at > now) {
                    remaining.push(pod.key());
                    continue;
                }
                match self.evict(pod).await? {
                    EvictionAnswer::Accepted => {
                        tracing::info!(pod = %pod.key(), node = %self.node, "eviction accepted");
                        summary.evicted.push(pod.key());
                        evicted.insert(pod.uid.clone(), pod.clone());
                        if !self.pod_gone(pod).await? {
                            remaining.push(pod.key());
                        }
                    }
                    EvictionAnswer::Gone => summary.gone.push(pod.key()),
                    EvictionAnswer::Refused(why) => {
                        tracing::info!(pod = %pod.key(), reason = ?why, "eviction refused; retrying later");
                        retry_at.insert(pod.uid.clone(), now + self.timing.eviction_retry_interval);
                        refused_now.get_or_insert(why);
                        remaining.push(pod.key());
                    }
                }
            }
            if remaining.is_empty() {
                progress(progress_text(&self.node, &[], None));
                return Ok(summary);
            }
            // A refusal keeps being the reason shown until evictions are asked again.
            if let Some(why) = refused_now {
                waiting = Some(why);
            } else if remaining.iter().all(|k| {
                evicted.values().any(|p| &p.key() == k)
                    || acted
                        .iter()
                        .any(|(p, v)| &p.key() == k && *v == Verdict::WaitDeleting)
            }) {
                waiting = Some(Waiting::Terminating);
            }
            let text = progress_text(&self.node, &remaining, waiting.as_ref());
            if text != last_text {
                progress(text.clone());
                last_text = text.clone();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DrainError::Timeout(bound(format!(
                    "drain of {} timed out: {} pod(s) still on the node: {}{}",
                    self.node,
                    remaining.len(),
                    name_pods(&remaining),
                    match &waiting {
                        Some(Waiting::Pdb(pdb)) => format!("; eviction blocked by PDB {pdb}"),
                        Some(Waiting::MultiplePdbs(pod)) =>
                            format!("; {pod} is covered by more than one PDB"),
                        Some(Waiting::Terminating) => "; evicted pods still terminating".into(),
                        Some(Waiting::Other(m)) => format!("; last eviction error: {m}"),
                        None => String::new(),
                    }
                ))));
            }
            tokio::time::sleep_until((now + self.timing.poll_interval).min(deadline)).await;
        }
    }
}

/// The set of pod keys, for tests and logs.
pub fn keys(pods: &[PodFacts]) -> BTreeSet<String> {
    pods.iter().map(PodFacts::key).collect()
}
