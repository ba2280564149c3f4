//! The fake management API's authorization: which verbs on which resources the server's ServiceAccount was
//! granted, read from the manifests we ship (Roles and ClusterRoles bound to it by RoleBindings and
//! ClusterRoleBindings), and what a request asks for (its verb, API group, resource, namespace), as the API
//! server's RBAC authorizer sees them. A request nothing grants is refused with the API server's 403 `Status`.

use serde_json::Value;

/// One rule of a Role or ClusterRole (`*` matches anything).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

/// What a request asks for, in the authorizer's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`.
    pub verb: String,
    /// API group (`""` for the core group).
    pub group: String,
    /// Plural resource (`machines`), with `/subresource` when there is one.
    pub resource: String,
    /// Namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// Object name (`None`: a collection).
    pub name: Option<String>,
}

impl Attributes {
    /// The attributes of `method` on `path`; `None` for the non-resource paths every authenticated user may
    /// read (discovery: `/api`, `/apis`, `/version`, …).
    pub fn of(method: &str, path: &str, query: Option<&str>) -> Option<Self> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => (String::new(), rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => ((*group).to_owned(), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_owned()), rest),
            _ => (None, rest),
        };
        let (resource, name) = match rest {
            [resource] => ((*resource).to_owned(), None),
            [resource, name] => ((*resource).to_owned(), Some((*name).to_owned())),
            [resource, name, sub, ..] => (format!("{resource}/{sub}"), Some((*name).to_owned())),
            [] => return None,
        };
        let watch =
            query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let verb = match (method, name.is_some()) {
            ("GET", _) if watch => "watch",
            ("GET" | "HEAD", true) => "get",
            ("GET" | "HEAD", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            (other, _) => {
                return Some(Self {
                    verb: other.to_ascii_lowercase(),
                    group,
                    resource,
                    namespace,
                    name,
                });
            }
        };
        Some(Self {
            verb: verb.to_owned(),
            group,
            resource,
            namespace,
            name,
        })
    }

    /// The API server's 403 message for a refused request by `user`.
    pub fn forbidden_message(&self, user: &str) -> String {
        let resource = self.resource.split('/').next().unwrap_or_default();
        let qualified = if self.group.is_empty() {
            resource.to_owned()
        } else {
            format!("{resource}.{}", self.group)
        };
        let what = match &self.name {
            Some(name) => format!("{qualified} \"{name}\""),
            None => qualified,
        };
        let scope = match &self.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_owned(),
        };
        format!(
            "{what} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            self.verb, self.resource, self.group
        )
    }
}

/// The rules granted to one ServiceAccount: cluster-wide ones (ClusterRoleBinding) and per-namespace ones
/// (RoleBinding).
#[derive(Clone, Debug, Default)]
pub struct Rbac {
    user: String,
    cluster: Vec<Rule>,
    namespaced: Vec<(String, Vec<Rule>)>,
}

impl Rbac {
    /// The grants of ServiceAccount `namespace/name` in the YAML `manifests` (several documents; clusterctl
    /// variables `${VAR:=default}` and `${VAR=default}` read as their default). An error names what could not
    /// be read.
    pub fn from_manifests(manifests: &str, namespace: &str, name: &str) -> Result<Self, String> {
        let text = with_defaults(manifests);
        let mut objects = Vec::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = <Value as serde::Deserialize>::deserialize(doc)
                .map_err(|e| format!("manifests are not YAML: {e}"))?;
            if value.is_object() {
                objects.push(value);
            }
        }
        let rules_of = |kind: &str, role: &str, role_ns: Option<&str>| -> Vec<Rule> {
            objects
                .iter()
                .filter(|o| o["kind"] == kind && o["metadata"]["name"] == role)
                .filter(|o| role_ns.is_none_or(|ns| o["metadata"]["namespace"] == ns))
                .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
                .map(|r| Rule {
                    groups: strings(&r["apiGroups"]),
                    resources: strings(&r["resources"]),
                    verbs: strings(&r["verbs"]),
                    names: strings(&r["resourceNames"]),
                })
                .collect()
        };
        let binds_us = |binding: &Value| {
            binding["subjects"].as_array().is_some_and(|subjects| {
                subjects.iter().any(|s| {
                    s["kind"] == "ServiceAccount"
                        && s["name"] == name
                        && s["namespace"] == namespace
                })
            })
        };
        let mut rbac = Self {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            ..Self::default()
        };
        for binding in objects.iter().filter(|o| binds_us(o)) {
            let role = binding["roleRef"]["name"].as_str().unwrap_or_default();
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap_or_default();
            let binding_ns = binding["metadata"]["namespace"].as_str();
            match (binding["kind"].as_str(), role_kind) {
                (Some("ClusterRoleBinding"), "ClusterRole") => {
                    rbac.cluster.extend(rules_of("ClusterRole", role, None));
                }
                (Some("RoleBinding"), kind) => {
                    let ns = binding_ns.unwrap_or(namespace).to_owned();
                    let rules = if kind == "Role" {
                        rules_of("Role", role, Some(&ns))
                    } else {
                        rules_of("ClusterRole", role, None)
                    };
                    rbac.namespaced.push((ns, rules));
                }
                _ => {}
            }
        }
        Ok(rbac)
    }

    /// The user the API server would see (`system:serviceaccount:NS:NAME`).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Whether any granted rule allows `request`.
    pub fn allows(&self, request: &Attributes) -> bool {
        let namespaced = self
            .namespaced
            .iter()
            .filter(|(ns, _)| Some(ns) == request.namespace.as_ref())
            .flat_map(|(_, rules)| rules);
        self.cluster
            .iter()
            .chain(namespaced)
            .any(|rule| rule.allows(request))
    }

    /// Every `(verb, group, resource)` granted anywhere, for tests and docs.
    pub fn grants(&self) -> Vec<(String, String, String)> {
        let mut out: Vec<_> = self
            .cluster
            .iter()
            .chain(self.namespaced.iter().flat_map(|(_, rules)| rules))
            .flat_map(|rule| {
                rule.verbs.iter().flat_map(move |verb| {
                    rule.groups.iter().flat_map(move |group| {
                        rule.resources
                            .iter()
                            .map(move |resource| (verb.clone(), group.clone(), resource.clone()))
                    })
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

impl Rule {
    fn allows(&self, request: &Attributes) -> bool {
        let any = |list: &[String], value: &str| list.iter().any(|x| x == "*" || x == value);
        any(&self.verbs, &request.verb)
            && any(&self.groups, &request.group)
            && any(&self.resources, &request.resource)
            && (self.names.is_empty()
                || request
                    .name
                    .as_ref()
                    .is_some_and(|name| self.names.contains(name)))
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// clusterctl's `${VAR:=default}` / `${VAR=default}` / `${VAR:-default}` replaced by their defaults (and a bare
/// `${VAR}` by nothing), as clusterctl renders with no variable set.
fn with_defaults(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let inner = &rest[start + 2..start + len];
        let default = ["=", ":=", ":-", "-"]
            .iter()
            .filter_map(|sep| inner.find(sep).map(|at| (at, sep.len())))
            .min()
            .map_or("", |(at, len)| &inner[at + len..]);
        out.push_str(default);
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MANIFESTS: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: updater}
rules:
- apiGroups: [cluster.x-k8s.io]
  resources: [machines]
  verbs: [get, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: updater}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: updater}
subjects:
- {kind: ServiceAccount, name: inplace-updater, namespace: "${NS:=system}"}
"#;

    fn request(method: &str, path: &str) -> Attributes {
        Attributes::of(method, path, None).unwrap()
    }

    #[test]
    fn grants_come_from_the_bound_roles_only() {
        let rbac = Rbac::from_manifests(MANIFESTS, "system", "inplace-updater").unwrap();
        let machine = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns1/machines/m1";
        assert!(rbac.allows(&request("GET", machine)));
        assert!(rbac.allows(&request("PATCH", machine)));
        assert!(!rbac.allows(&request("DELETE", machine)));
        assert!(!rbac.allows(&request("PUT", machine)));
        assert!(!rbac.allows(&request(
            "GET",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns1/machines"
        )));
        assert!(!rbac.allows(&request("GET", "/api/v1/namespaces/ns1/secrets/s")));
        let other = Rbac::from_manifests(MANIFESTS, "elsewhere", "inplace-updater").unwrap();
        assert!(!other.allows(&request("GET", machine)));
    }

    #[test]
    fn the_refusal_reads_as_the_api_servers() {
        let refused = request(
            "DELETE",
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns1/machines/m1",
        );
        assert_eq!(
            refused.forbidden_message("system:serviceaccount:s:u"),
            "machines.cluster.x-k8s.io \"m1\" is forbidden: User \"system:serviceaccount:s:u\" cannot delete resource \"machines\" in API group \"cluster.x-k8s.io\" in the namespace \"ns1\""
        );
        assert_eq!(Attributes::of("GET", "/apis", None), None);
    }
}
