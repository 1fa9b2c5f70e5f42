//! Reading Kubernetes objects from files: YAML or JSON; one object, a List
//! (`List`, `NodeList`, `PodList` with `items`), or several YAML documents.
//! Malformed input names the file and the field.

use std::path::Path;

use serde::de::DeserializeOwned;

/// A file that could not be read as the expected objects.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {msg}")]
pub struct InputError {
    pub file: String,
    pub msg: String,
}

fn err(file: &Path, msg: impl Into<String>) -> InputError {
    InputError { file: file.display().to_string(), msg: msg.into() }
}

/// Parses every object of kind `kind` in `text` (documents, lists). Objects
/// of other kinds are skipped, so a whole manifest file can be given; a file
/// with none of `kind` is an error naming what it has.
pub fn parse<T: DeserializeOwned>(text: &str, kind: &str, file: &Path) -> Result<Vec<T>, InputError> {
    let mut out = Vec::new();
    let mut others = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml_ng::Value::deserialize_any_doc(doc).map_err(|e| err(file, format!("document {}: {e}", i + 1)))?;
        if value.is_null() {
            continue;
        }
        let json: serde_json::Value = serde_json::to_value(&value).map_err(|e| err(file, format!("document {}: {e}", i + 1)))?;
        collect(json, kind, file, &mut out, &mut others)?;
    }
    if out.is_empty() && !others.is_empty() {
        others.dedup();
        return Err(err(file, format!("kind: expected {kind}, found {}", others.join(", "))));
    }
    Ok(out)
}

trait DocExt {
    fn deserialize_any_doc(doc: serde_yaml_ng::Deserializer<'_>) -> Result<serde_yaml_ng::Value, serde_yaml_ng::Error>;
}

impl DocExt for serde_yaml_ng::Value {
    fn deserialize_any_doc(doc: serde_yaml_ng::Deserializer<'_>) -> Result<serde_yaml_ng::Value, serde_yaml_ng::Error> {
        serde::Deserialize::deserialize(doc)
    }
}

fn collect<T: DeserializeOwned>(
    v: serde_json::Value,
    kind: &str,
    file: &Path,
    out: &mut Vec<T>,
    others: &mut Vec<String>,
) -> Result<(), InputError> {
    let k = v.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if k == "List" || k.ends_with("List") {
        let items = v.get("items").and_then(|i| i.as_array()).cloned().ok_or_else(|| err(file, format!("{k} without items")))?;
        for item in items {
            collect(item, kind, file, out, others)?;
        }
        return Ok(());
    }
    if !k.is_empty() && k != kind {
        others.push(k.to_string());
        return Ok(());
    }
    let name = v.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
    let obj = serde_path_to_error::deserialize(v).map_err(|e| err(file, format!("{kind} {name}: field {}: {}", e.path(), e.inner())))?;
    out.push(obj);
    Ok(())
}

/// Reads all objects of `kind` from a file.
pub fn read<T: DeserializeOwned>(path: &Path, kind: &str) -> Result<Vec<T>, InputError> {
    let text = std::fs::read_to_string(path).map_err(|e| err(path, e.to_string()))?;
    parse(&text, kind, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    #[test]
    fn reads_documents_lists_and_json() {
        let f = Path::new("nodes.yaml");
        let yaml = "apiVersion: v1\nkind: Node\nmetadata: {name: a}\n---\napiVersion: v1\nkind: NodeList\nitems:\n- metadata: {name: b}\n- kind: Node\n  metadata: {name: c}\n";
        let nodes: Vec<Node> = parse(yaml, "Node", f).unwrap();
        let names: Vec<_> = nodes.iter().map(|n| n.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["a", "b", "c"]);
        let json = r#"{"kind":"List","items":[{"kind":"Node","metadata":{"name":"x"}}]}"#;
        assert_eq!(parse::<Node>(json, "Node", f).unwrap().len(), 1);
    }

    #[test]
    fn errors_name_file_and_field() {
        let f = Path::new("nodes.yaml");
        let e =
            parse::<Node>("kind: Node\nmetadata: {name: a}\nspec: {taints: [{key: k, effect: 5}]}\n", "Node", f).unwrap_err().to_string();
        assert!(e.contains("nodes.yaml") && e.contains("spec.taints[0].effect"), "{e}");
        let e = parse::<Node>("kind: Pod\nmetadata: {name: a}\n", "Node", f).unwrap_err().to_string();
        assert!(e.contains("expected Node, found Pod"), "{e}");
        // Other kinds in a manifest are skipped.
        let n = parse::<Node>("kind: Namespace\nmetadata: {name: x}\n---\nkind: Node\nmetadata: {name: a}\n", "Node", f).unwrap();
        assert_eq!(n.len(), 1);
        let e = parse::<Node>("kind: Node\n  bad: [\n", "Node", f).unwrap_err().to_string();
        assert!(e.contains("nodes.yaml") && e.contains("document 1"), "{e}");
    }
}
