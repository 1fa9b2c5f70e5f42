//! A small in-memory Kubernetes API server for tests over real HTTP: list,
//! watch with resourceVersion replay, create, replace, apply / merge / JSON
//! patch, delete, status subresources, label and field selectors, optional
//! injected faults, and a log of every request.
//!
//! Where the controller's correctness hangs on them, it keeps the real
//! server's semantics:
//! - server-side apply is field-managed: a manager owns the fields it
//!   applied; applying again without a field it alone owned removes that
//!   field; other writes take ownership of what they change; lists of
//!   objects with a `type` (conditions) are maps keyed by type, other
//!   lists are atomic; a conflict with another owner is 409 unless forced;
//! - `metadata.resourceVersion` in any write is a precondition (409);
//! - NodeAgents and pods have a status subresource: writes to the object
//!   leave its status alone, writes to `/status` change only the status,
//!   and a NodeAgent's generation moves only with its spec;
//! - with `owner_admission` (the OwnerReferencesPermissionEnforcement
//!   plugin) an ownerReference with blockOwnerDeletion needs `update` on
//!   the owner's `finalizers` subresource, judged by the ClusterRole rules
//!   given.
//!
//! It is not Kubernetes otherwise: no other admission, no garbage
//! collection, and deletes are immediate. It runs the clients' own wiring
//! (informers, watches, leader election) for real; exact requests are
//! asserted by the mock tests.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use serde_json::{json, Value};
use tokio::sync::Notify;

pub type Body = http_body_util::Either<Full<Bytes>, StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>>;

type Key = (String, String, String);
/// A field: its path from the object's root; a condition is `[type=X]`.
type Field = Vec<String>;

#[derive(Default)]
pub struct State {
    pub rv: u64,
    pub objects: BTreeMap<Key, Value>,
    pub log: Vec<(u64, String, String, &'static str, Value)>,
    /// Per object, the fields each manager owns.
    pub managed: BTreeMap<Key, BTreeMap<String, BTreeSet<Field>>>,
}

pub struct Api {
    pub state: Mutex<State>,
    pub changed: Notify,
    /// Percent of writes answered with an error (not applied), and of watch
    /// batches after which the watch is dropped.
    pub faults: std::sync::atomic::AtomicU64,
    pub injected: std::sync::atomic::AtomicU64,
    rng: std::sync::atomic::AtomicU64,
    /// Every request's method, path and query, in order.
    pub requests: Mutex<Vec<String>>,
    /// OwnerReferencesPermissionEnforcement on: the writer's ClusterRole
    /// rules (as in deploy/), for every writer.
    pub owner_admission: Mutex<Option<Vec<Value>>>,
    /// Broken or hostile answers to pod lists and watches (all off by default).
    pub pod_faults: PodFaults,
}

/// How the server misbehaves towards pod lists and watches.
#[derive(Default)]
pub struct PodFaults {
    /// A pod watch is answered with one line of this many bytes that never
    /// ends (0: off); the bytes sent so far are counted in `endless_sent`.
    pub endless_line: std::sync::atomic::AtomicU64,
    pub endless_sent: std::sync::atomic::AtomicU64,
    /// Pod lists get no answer while this is set (and are answered when it
    /// is cleared).
    pub hang_lists: std::sync::atomic::AtomicBool,
    /// Every pod watch is answered with a 410 Gone error event at once.
    pub gone_watches: std::sync::atomic::AtomicBool,
    /// Out of reach for pods and Services: requests are answered 503 and
    /// the watches open end (within half a second), while this is set.
    pub unreachable: std::sync::atomic::AtomicBool,
}

impl PodFaults {
    /// A fault for pod watches is on.
    fn watch(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.endless_line.load(Ordering::Relaxed) > 0 || self.gone_watches.load(Ordering::Relaxed)
    }
}

/// A stream body sending `total` bytes on one line in 64 KiB chunks,
/// counting them in `sent`, until the client goes.
fn endless_line(api: Arc<Api>, total: u64) -> Body {
    use std::sync::atomic::Ordering;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let head = Bytes::from_static(b"{\"type\":\"ADDED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"");
        let chunk = Bytes::from(vec![b'a'; 64 << 10]);
        if tx.send(Ok(Frame::data(head))).await.is_err() {
            return;
        }
        let mut sent = 0;
        while sent < total {
            if tx.send(Ok(Frame::data(chunk.clone()))).await.is_err() {
                return;
            }
            sent += chunk.len() as u64;
            api.pod_faults.endless_sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
        // Then hold the stream open, as a hung server would.
        tx.closed().await;
    });
    http_body_util::Either::Right(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// A watch answered with one 410 Gone error event.
fn gone_watch() -> Body {
    let line = format!("{}\n", json!({"type": "ERROR", "object": status(410, "Expired").1}));
    http_body_util::Either::Left(Full::new(Bytes::from(line)))
}

/// Resources with a status subresource.
fn has_status(resource: &str) -> bool {
    resource == "nodeagents" || resource == "pods"
}

/// The fields of `v` under `prefix`: leaves, atomic lists, and the items of
/// lists of typed objects (conditions), each whole.
fn fields(v: &Value, prefix: &mut Field, out: &mut BTreeSet<Field>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                prefix.push(k.clone());
                fields(x, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) if !a.is_empty() && a.iter().all(|x| x.get("type").and_then(Value::as_str).is_some()) => {
            for x in a {
                prefix.push(format!("[type={}]", x["type"].as_str().unwrap_or_default()));
                out.insert(prefix.clone());
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// The fields a write can own: not the identity in metadata.
fn owned_fields(v: &Value) -> BTreeSet<Field> {
    let mut out = BTreeSet::new();
    fields(v, &mut Vec::new(), &mut out);
    out.retain(|f| match f.first().map(String::as_str) {
        Some("apiVersion") | Some("kind") | None => false,
        Some("metadata") => matches!(f.get(1).map(String::as_str), Some("labels" | "annotations" | "ownerReferences" | "finalizers")),
        _ => true,
    });
    out
}

fn field<'a>(v: &'a Value, f: &Field) -> Option<&'a Value> {
    let mut cur = v;
    for seg in f {
        cur = match seg.strip_prefix("[type=").and_then(|s| s.strip_suffix(']')) {
            Some(t) => cur.as_array()?.iter().find(|x| x["type"] == t)?,
            None => cur.get(seg)?,
        };
    }
    Some(cur)
}

fn remove_field(v: &mut Value, f: &Field) {
    let Some((last, parents)) = f.split_last() else { return };
    let mut cur = v;
    for seg in parents {
        let next = match seg.strip_prefix("[type=").and_then(|s| s.strip_suffix(']')) {
            Some(t) => cur.as_array_mut().and_then(|a| a.iter_mut().find(|x| x["type"] == t)),
            None => cur.get_mut(seg),
        };
        let Some(n) = next else { return };
        cur = n;
    }
    match last.strip_prefix("[type=").and_then(|s| s.strip_suffix(']')) {
        Some(t) => {
            if let Some(a) = cur.as_array_mut() {
                a.retain(|x| x["type"] != t);
            }
        }
        None => {
            if let Some(o) = cur.as_object_mut() {
                o.remove(last);
            }
        }
    }
}

/// The object a write leaves: through /status only the status changes;
/// elsewhere, on a resource with a status subresource, everything but it.
fn scoped(resource: &str, sub: Option<&str>, old: &Value, new: Value) -> Value {
    match sub {
        Some("status") => {
            let mut o = old.clone();
            o["status"] = new["status"].clone();
            o
        }
        _ if has_status(resource) => {
            let mut n = new;
            match old.get("status") {
                Some(st) => n["status"] = st.clone(),
                None => {
                    n.as_object_mut().map(|o| o.remove("status"));
                }
            }
            n
        }
        _ => new,
    }
}

/// A NodeAgent's generation moves with its spec only.
fn bump_generation(resource: &str, old: &Value, new: &mut Value) {
    if resource == "nodeagents" {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(if new["spec"] != old["spec"] { g + 1 } else { g });
    }
}

/// A non-apply write: its manager owns what it changed; removed fields
/// are nobody's.
fn take_ownership(managers: &mut BTreeMap<String, BTreeSet<Field>>, manager: &str, old: &Value, new: &Value) {
    let after = owned_fields(new);
    let changed: BTreeSet<Field> = after.iter().filter(|f| field(old, f) != field(new, f)).cloned().collect();
    for (m, set) in managers.iter_mut() {
        set.retain(|f| after.contains(f) && (m == manager || !changed.contains(f)));
    }
    managers.entry(manager.to_string()).or_default().extend(changed);
}

/// Whether ClusterRole `rules` allow `verb` on `resource` of `group`.
pub fn rbac_allows(rules: &[Value], group: &str, resource: &str, verb: &str) -> bool {
    let has = |r: &Value, k: &str, want: &str| r[k].as_array().is_some_and(|a| a.iter().any(|x| x == want || x == "*"));
    rules.iter().any(|r| has(r, "apiGroups", group) && has(r, "resources", resource) && has(r, "verbs", verb))
}

pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// (resource, namespace, name, subresource) of an API path.
fn route(path: &str) -> Option<(String, String, Option<String>, Option<String>)> {
    let seg: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match *seg.first()? {
        "api" => &seg[2..],
        "apis" => &seg[3..],
        _ => return None,
    };
    let (ns, rest) =
        if rest.first() == Some(&"namespaces") && rest.len() >= 3 { (rest[1].to_string(), &rest[2..]) } else { (String::new(), rest) };
    Some((rest.first()?.to_string(), ns, rest.get(1).map(|s| s.to_string()), rest.get(2).map(|s| s.to_string())))
}

/// A label selector (`k=v`, `k`) and a field selector (`spec.nodeName=x`,
/// `metadata.name=x`) both match.
fn selects(selector: &str, fields: &str, obj: &Value) -> bool {
    let field_ok = fields.split(',').filter(|s| !s.is_empty()).all(|term| match term.split_once('=') {
        Some((path, v)) => path.split('.').fold(obj, |o, k| &o[k]).as_str() == Some(v.trim_start_matches('=')),
        None => false,
    });
    field_ok && labels_match(selector, obj)
}

fn labels_match(selector: &str, obj: &Value) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let labels = &obj["metadata"]["labels"];
        match term.split_once('=') {
            Some((k, v)) => labels[k] == v,
            None => !labels[term].is_null(),
        }
    })
}

/// Apply as a deep merge; lists of objects with a "type" merge by type.
fn merge(dst: &mut Value, src: &Value) {
    match (dst, src) {
        (Value::Object(d), Value::Object(s)) => {
            for (k, v) in s {
                merge(d.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (Value::Array(d), Value::Array(s)) if s.iter().all(|x| x.get("type").is_some()) && d.iter().all(|x| x.get("type").is_some()) => {
            for item in s {
                match d.iter_mut().find(|x| x["type"] == item["type"]) {
                    Some(x) => merge(x, item),
                    None => d.push(item.clone()),
                }
            }
        }
        (d, s) => *d = s.clone(),
    }
}

fn merge_patch(dst: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !dst.is_object() {
                *dst = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    dst.as_object_mut().map(|o| o.remove(k));
                } else {
                    merge_patch(dst.as_object_mut().map(|o| o.entry(k.clone()).or_insert(Value::Null)).expect("object"), v);
                }
            }
        }
        p => *dst = p.clone(),
    }
}

pub fn status(code: u16, reason: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": reason, "code": code, "message": reason}),
    )
}

impl Default for Api {
    fn default() -> Self {
        Api::new()
    }
}

impl Api {
    pub fn new() -> Api {
        use std::sync::atomic::AtomicU64;
        Api {
            state: Mutex::new(State::default()),
            changed: Notify::new(),
            faults: AtomicU64::new(0),
            injected: AtomicU64::new(0),
            rng: AtomicU64::new(0x9e37_79b9_7f4a_7c15),
            requests: Mutex::new(Vec::new()),
            owner_admission: Mutex::new(None),
            pod_faults: PodFaults::default(),
        }
    }

    /// A fault, with the configured probability.
    fn roll(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let pct = self.faults.load(Ordering::Relaxed);
        if pct == 0 {
            return None;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        (x % 100 < pct).then(|| {
            self.injected.fetch_add(1, Ordering::Relaxed);
            x
        })
    }

    /// Stores `obj` (new or changed) and logs the event.
    pub fn put(&self, st: &mut State, resource: &str, ns: &str, name: &str, mut obj: Value, created: bool) -> Value {
        st.rv += 1;
        let rv = st.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        if created {
            obj["metadata"]["uid"] = json!(format!("uid-{rv}"));
            obj["metadata"]["creationTimestamp"] = json!(now());
            if resource == "nodeagents" {
                obj["metadata"]["generation"] = json!(1);
            }
        }
        st.objects.insert((resource.into(), ns.into(), name.into()), obj.clone());
        st.log.push((rv, resource.into(), ns.into(), if created { "ADDED" } else { "MODIFIED" }, obj.clone()));
        self.changed.notify_waiters();
        obj
    }

    /// A write as the tests make it (manager "test", not forced).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        method: &str,
        resource: &str,
        ns: &str,
        name: Option<&str>,
        sub: Option<&str>,
        ctype: &str,
        body: Value,
    ) -> (u16, Value) {
        self.write_as("test", false, method, resource, ns, name, sub, ctype, body)
    }

    /// OwnerReferencesPermissionEnforcement: a new ownerReference with
    /// blockOwnerDeletion needs `update` on the owner's finalizers.
    fn admit_owners(&self, old: Option<&Value>, body: &Value) -> Option<(u16, Value)> {
        let guard = self.owner_admission.lock().expect("admission");
        let rules = guard.as_ref()?;
        let refs = body["metadata"]["ownerReferences"].as_array()?;
        for r in refs.iter().filter(|r| r["blockOwnerDeletion"] == true) {
            if old.and_then(|o| o["metadata"]["ownerReferences"].as_array()).is_some_and(|a| a.contains(r)) {
                continue;
            }
            let group = r["apiVersion"].as_str().and_then(|v| v.split_once('/')).map(|(g, _)| g).unwrap_or("");
            let plural = format!("{}s", r["kind"].as_str().unwrap_or_default().to_lowercase());
            if !rbac_allows(rules, group, &format!("{plural}/finalizers"), "update") {
                let msg = format!(
                    "cannot set blockOwnerDeletion if an ownerReference refers to a resource you can't set finalizers on: \
                     User \"system:serviceaccount\" cannot update resource \"{plural}/finalizers\" in API group \"{group}\""
                );
                return Some((
                    403,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403, "message": msg}),
                ));
            }
        }
        None
    }

    /// A write by `manager` (server-side apply's field manager; `force`
    /// takes fields from other managers).
    #[allow(clippy::too_many_arguments)]
    pub fn write_as(
        &self,
        manager: &str,
        force: bool,
        method: &str,
        resource: &str,
        ns: &str,
        name: Option<&str>,
        sub: Option<&str>,
        ctype: &str,
        body: Value,
    ) -> (u16, Value) {
        let mut st = self.state.lock().expect("state");
        let key = |n: &str| (resource.to_string(), ns.to_string(), n.to_string());
        let old = name.and_then(|n| st.objects.get(&key(n)).cloned());
        // Managed fields are kept per manager and subresource, as the real
        // server's managedFields entries are.
        let manager_key = match sub {
            Some(sub) => format!("{manager}/{sub}"),
            None => manager.to_string(),
        };
        let manager = manager_key.as_str();
        if matches!(method, "POST" | "PUT" | "PATCH") {
            if let Some(denied) = self.admit_owners(old.as_ref(), &body) {
                return denied;
            }
        }
        // A resourceVersion in the body is a precondition.
        if let (Some(o), Some(rv)) = (&old, body["metadata"]["resourceVersion"].as_str()) {
            if o["metadata"]["resourceVersion"].as_str() != Some(rv) {
                return status(409, "Conflict");
            }
        }
        match method {
            "POST" => {
                let mut body = body;
                let n = match body["metadata"]["name"].as_str() {
                    Some(n) => n.to_string(),
                    None => format!("{}{}", body["metadata"]["generateName"].as_str().unwrap_or("obj-"), st.rv + 1),
                };
                body["metadata"]["name"] = json!(n);
                if !ns.is_empty() {
                    body["metadata"]["namespace"] = json!(ns);
                }
                if st.objects.contains_key(&key(&n)) {
                    return status(409, "AlreadyExists");
                }
                if resource == "nodeagents" {
                    body.as_object_mut().map(|o| o.remove("status"));
                }
                st.managed.insert(key(&n), [(manager.to_string(), owned_fields(&body))].into());
                (201, self.put(&mut st, resource, ns, &n, body, true))
            }
            "PUT" => {
                let n = name.unwrap_or_default();
                let Some(old) = old else { return status(404, "NotFound") };
                if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                    return status(409, "Conflict");
                }
                let mut new = scoped(resource, sub, &old, body);
                new["metadata"]["uid"] = old["metadata"]["uid"].clone();
                new["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
                bump_generation(resource, &old, &mut new);
                take_ownership(st.managed.entry(key(n)).or_default(), manager, &old, &new);
                (200, self.put(&mut st, resource, ns, n, new, false))
            }
            "PATCH" => {
                let n = name.unwrap_or_default();
                let Some(old) = old else {
                    if ctype == "application/apply-patch+yaml" && sub.is_none() {
                        let mut b = body;
                        b["metadata"]["namespace"] = json!(ns);
                        if resource == "nodeagents" {
                            b.as_object_mut().map(|o| o.remove("status"));
                        }
                        st.managed.insert(key(n), [(manager.to_string(), owned_fields(&b))].into());
                        return (201, self.put(&mut st, resource, ns, n, b, true));
                    }
                    return status(404, "NotFound");
                };
                let mut new = match ctype {
                    "application/apply-patch+yaml" => {
                        // What this apply may touch: the status through /status, the rest otherwise.
                        let mut scope = body.clone();
                        match sub {
                            Some("status") => scope = json!({ "status": body["status"].clone() }),
                            _ if has_status(resource) => {
                                scope.as_object_mut().map(|o| o.remove("status"));
                            }
                            _ => {}
                        }
                        let applied = owned_fields(&scope);
                        let managers = st.managed.entry(key(n)).or_default();
                        if !force {
                            for (m, set) in managers.iter() {
                                if m != manager && set.iter().any(|f| applied.contains(f) && field(&old, f) != field(&scope, f)) {
                                    return status(409, "Conflict");
                                }
                            }
                        }
                        let mut obj = old.clone();
                        let before = managers.get(manager).cloned().unwrap_or_default();
                        for f in before.difference(&applied) {
                            if !managers.iter().any(|(m, set)| m != manager && set.contains(f)) {
                                remove_field(&mut obj, f);
                            }
                        }
                        merge(&mut obj, &scope);
                        for (m, set) in managers.iter_mut() {
                            if m != manager {
                                set.retain(|f| !applied.contains(f));
                            }
                        }
                        managers.insert(manager.to_string(), applied);
                        obj
                    }
                    "application/merge-patch+json" | "application/json-patch+json" => {
                        let mut obj = old.clone();
                        if ctype == "application/merge-patch+json" {
                            merge_patch(&mut obj, &body);
                        } else {
                            let Ok(p) = serde_json::from_value::<json_patch::Patch>(body) else { return status(400, "BadRequest") };
                            if json_patch::patch(&mut obj, &p).is_err() {
                                return status(422, "Invalid");
                            }
                        }
                        let obj = scoped(resource, sub, &old, obj);
                        take_ownership(st.managed.entry(key(n)).or_default(), manager, &old, &obj);
                        obj
                    }
                    _ => return status(415, "UnsupportedMediaType"),
                };
                bump_generation(resource, &old, &mut new);
                (200, self.put(&mut st, resource, ns, n, new, false))
            }
            "DELETE" => {
                let n = name.unwrap_or_default();
                let Some(old) = st.objects.remove(&key(n)) else { return status(404, "NotFound") };
                st.managed.remove(&key(n));
                st.rv += 1;
                let rv = st.rv;
                st.log.push((rv, resource.into(), ns.into(), "DELETED", old.clone()));
                self.changed.notify_waiters();
                (200, old)
            }
            _ => status(405, "MethodNotAllowed"),
        }
    }

    pub fn list(&self, resource: &str, ns: &str, selector: &str, fields: &str) -> Value {
        self.list_page(resource, ns, selector, fields, None, None)
    }

    /// A list, paged as the API server pages it: at most `limit` items, in
    /// key order, after the key a `continue` token names, with a `continue`
    /// token in the metadata when more remain. (The real server serves
    /// every page from the first page's snapshot; this one from the state
    /// now, with the first page's resourceVersion.)
    pub fn list_page(&self, resource: &str, ns: &str, selector: &str, fields: &str, limit: Option<usize>, cont: Option<&str>) -> Value {
        let st = self.state.lock().expect("state");
        let (rv, after) = match cont.and_then(|c| c.split_once(':')) {
            Some((rv, after)) => (rv.to_string(), Some(after.to_string())),
            None => (st.rv.to_string(), None),
        };
        let after = after.as_deref().map(|a| a.split_once('/').unwrap_or(("", a)));
        let mut matching = st
            .objects
            .iter()
            .filter(|((r, n, _), o)| r == resource && (ns.is_empty() || n == ns) && selects(selector, fields, o))
            .filter(|((_, n, name), _)| after.is_none_or(|a| (n.as_str(), name.as_str()) > a));
        let (mut items, mut last, mut more) = (Vec::new(), None, false);
        for ((_, n, name), o) in matching.by_ref() {
            if limit.is_some_and(|l| items.len() >= l) {
                more = true;
                break;
            }
            items.push(o.clone());
            last = Some(format!("{n}/{name}"));
        }
        let mut meta = json!({"resourceVersion": rv});
        if let (true, Some(last)) = (more, last) {
            meta["continue"] = json!(format!("{rv}:{last}"));
        }
        json!({"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items})
    }

    pub fn get(&self, resource: &str, ns: &str, name: &str) -> (u16, Value) {
        let st = self.state.lock().expect("state");
        match st.objects.get(&(resource.into(), ns.into(), name.into())) {
            Some(o) => (200, o.clone()),
            None => status(404, "NotFound"),
        }
    }

    /// Every event after `from` for the resource, as watch lines, until the client goes.
    fn watch(self: Arc<Self>, resource: String, ns: String, selector: String, fields: String, from: u64) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut seen = from;
            loop {
                if (resource == "pods" || resource == "services") && self.pod_faults.unreachable.load(std::sync::atomic::Ordering::Relaxed)
                {
                    return;
                }
                let notified = self.changed.notified();
                let lines: Vec<(u64, String)> = {
                    let st = self.state.lock().expect("state");
                    st.log
                        .iter()
                        .filter(|(rv, r, n, _, o)| {
                            *rv > seen && *r == resource && (ns.is_empty() || *n == ns) && selects(&selector, &fields, o)
                        })
                        .map(|(rv, _, _, t, o)| (*rv, format!("{}\n", json!({"type": t, "object": o}))))
                        .collect()
                };
                for (rv, line) in lines {
                    seen = rv;
                    if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                        return;
                    }
                }
                // A dropped watch: the client must re-list or re-watch.
                if self.roll().is_some() {
                    return;
                }
                seen = seen.max(self.state.lock().expect("state").rv.min(seen));
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {
                        if tx.is_closed() { return; }
                    }
                }
            }
        });
        http_body_util::Either::Right(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    pub async fn handle(self: Arc<Self>, req: Request<hyper::body::Incoming>) -> Result<Response<Body>, Infallible> {
        let method = req.method().as_str().to_string();
        let path = req.uri().path().to_string();
        let query: BTreeMap<String, String> = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned().collect();
        self.requests.lock().expect("requests").push(format!("{method} {}", req.uri()));
        let ctype = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let Some((resource, ns, name, sub)) = route(&path) else {
            let (c, v) = status(404, "NotFound");
            return Ok(json_response(c, v));
        };
        let selector = query.get("labelSelector").cloned().unwrap_or_default();
        let fields = query.get("fieldSelector").cloned().unwrap_or_default();
        if (resource == "pods" || resource == "services") && self.pod_faults.unreachable.load(std::sync::atomic::Ordering::Relaxed) {
            let (c, v) = status(503, "ServiceUnavailable");
            return Ok(json_response(c, v));
        }
        let (code, v) = match (method.as_str(), &name) {
            ("GET", None) if query.get("watch").map(String::as_str) == Some("true") && resource == "pods" && self.pod_faults.watch() => {
                let total = self.pod_faults.endless_line.load(std::sync::atomic::Ordering::Relaxed);
                let body = if total > 0 { endless_line(self.clone(), total) } else { gone_watch() };
                return Ok(Response::builder().header("content-type", "application/json").body(body).expect("response"));
            }
            ("GET", None) if query.get("watch").map(String::as_str) == Some("true") => {
                let from = query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
                let body = self.watch(resource, ns, selector, fields, from);
                return Ok(Response::builder().header("content-type", "application/json").body(body).expect("response"));
            }
            ("GET", None) => {
                while resource == "pods" && self.pod_faults.hang_lists.load(std::sync::atomic::Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let limit = query.get("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0);
                (200, self.list_page(&resource, &ns, &selector, &fields, limit, query.get("continue").map(String::as_str)))
            }
            ("GET", Some(n)) => self.get(&resource, &ns, n),
            // Injected faults on writes (not the lease: that only slows leadership down).
            (_, _) if resource != "leases" && resource != "events" && self.roll().is_some() => {
                match self.rng.load(std::sync::atomic::Ordering::Relaxed) % 3 {
                    0 => status(500, "InternalError"),
                    1 => status(429, "TooManyRequests"),
                    _ => status(409, "Conflict"),
                }
            }
            (m, n) => {
                let manager = query.get("fieldManager").cloned().unwrap_or_else(|| "unknown".into());
                let force = query.get("force").map(String::as_str) == Some("true");
                self.write_as(&manager, force, m, &resource, &ns, n.as_deref(), sub.as_deref(), &ctype, body)
            }
        };
        Ok(json_response(code, v))
    }
}

pub fn json_response(code: u16, v: Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(http_body_util::Either::Left(Full::new(Bytes::from(serde_json::to_vec(&v).expect("json")))))
        .expect("response")
}

/// Serves `api` on a loopback port, on the current tokio runtime.
pub async fn serve(api: Arc<Api>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let api = api.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| api.clone().handle(req));
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(stream), svc).await;
            });
        }
    });
    addr
}

/// Serves `api` over TLS (`cert_pem` and `key_pem`: a server certificate
/// chain and its key) on `bind`, answering only requests that carry
/// `Authorization: Bearer <token>` (401 otherwise), as the API server
/// answers a pod's service account.
pub async fn serve_tls(api: Arc<Api>, bind: SocketAddr, cert_pem: &[u8], key_pem: &[u8], token: String) -> std::io::Result<SocketAddr> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(cert_pem).collect::<Result<_, _>>().map_err(|e| bad(format!("certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad(format!("key: {e}")))?;
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad(e.to_string()))?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    let want = Arc::new(format!("Bearer {token}"));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (api, acceptor, want) = (api.clone(), acceptor.clone(), want.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (api, want) = (api.clone(), want.clone());
                    async move {
                        let authorized = req.headers().get("authorization").and_then(|v| v.to_str().ok()) == Some(want.as_str());
                        if !authorized {
                            return Ok(json_response(401, status(401, "Unauthorized").1));
                        }
                        api.handle(req).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(tls), svc).await;
            });
        }
    });
    Ok(addr)
}

/// An API server running on a runtime of its own, with a kubeconfig file
/// pointing at it (plain HTTP, no credentials).
pub struct Running {
    pub api: Arc<Api>,
    pub addr: SocketAddr,
    pub kubeconfig: tempfile::NamedTempFile,
    _rt: tokio::runtime::Runtime,
}

impl Running {
    /// Over TLS with a bearer token (see [`serve_tls`]), on `bind`; the
    /// kubeconfig names the server with the token and the CA.
    pub fn start_tls(
        api: Arc<Api>,
        bind: SocketAddr,
        cert_pem: &[u8],
        key_pem: &[u8],
        ca_pem: &[u8],
        token: &str,
    ) -> std::io::Result<Running> {
        use base64::Engine as _;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let addr = rt.block_on(serve_tls(api.clone(), bind, cert_pem, key_pem, token.to_string()))?;
        let kubeconfig = tempfile::NamedTempFile::new()?;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        std::fs::write(
            kubeconfig.path(),
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: tls\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: tls\n  context:\n    cluster: tls\n    user: sa\ncurrent-context: tls\n"),
        )?;
        Ok(Running { api, addr, kubeconfig, _rt: rt })
    }

    pub fn start(api: Arc<Api>) -> std::io::Result<Running> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let addr = rt.block_on(serve(api.clone()));
        let kubeconfig = tempfile::NamedTempFile::new()?;
        std::fs::write(
            kubeconfig.path(),
            format!("apiVersion: v1\nkind: Config\nclusters:\n- name: mock\n  cluster:\n    server: http://{addr}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: mock\n  context:\n    cluster: mock\n    user: u\ncurrent-context: mock\n"),
        )?;
        Ok(Running { api, addr, kubeconfig, _rt: rt })
    }
}

/// A running pod as the API server returns it, with one container.
pub fn pod(uid: &str, ns: &str, name: &str, node: &str, container: &str, container_id: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": container, "image": "x"}]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": container, "containerID": format!("containerd://{container_id}"), "image": "x", "imageID": "x", "ready": true, "restartCount": 0
        }]}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_page_in_key_order_with_continue_tokens() {
        let api = Api::new();
        {
            let mut st = api.state.lock().expect("state");
            // "ns-1-a" sorts before "ns-1" as a string with '/', not as a key.
            for (ns, name) in [("ns-1", "b"), ("ns-1-a", "a"), ("ns-1", "a"), ("ns-10", "a"), ("ns-2", "c")] {
                api.put(&mut st, "services", ns, name, json!({"metadata": {"name": name, "namespace": ns}}), false);
            }
        }
        let mut seen = Vec::new();
        let mut cont: Option<String> = None;
        let mut pages = 0;
        loop {
            let page = api.list_page("services", "", "", "", Some(2), cont.as_deref());
            pages += 1;
            for i in page["items"].as_array().expect("items") {
                seen.push(format!(
                    "{}/{}",
                    i["metadata"]["namespace"].as_str().unwrap_or(""),
                    i["metadata"]["name"].as_str().unwrap_or("")
                ));
            }
            match page["metadata"]["continue"].as_str() {
                Some(c) => cont = Some(c.to_string()),
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(seen, ["ns-1/a", "ns-1/b", "ns-1-a/a", "ns-10/a", "ns-2/c"]);
        let all = api.list("services", "", "", "");
        assert_eq!(all["items"].as_array().map(Vec::len), Some(5));
        assert!(all["metadata"].get("continue").is_none());
    }
}
