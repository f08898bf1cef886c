//! What kubectl sends as protobuf (`application/vnd.kubernetes.protobuf`), read into the
//! JSON the test API server stores: the `k8s\0` envelope (runtime.Unknown: typeMeta 1
//! with apiVersion 1 and kind 2, raw 2), then the object by the field numbers of
//! upstream's `generated.proto`. kubectl 1.32 creates ConfigMaps and Secrets this way
//! (`kubectl create configmap`, `kubectl create secret generic`), and approves CSRs.

use base64::Engine;
use serde_json::{Map, Value, json};

/// One field of a protobuf message.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

impl<'a> Field<'a> {
    pub(crate) fn bytes(self) -> Option<&'a [u8]> {
        match self {
            Field::Bytes(b) => Some(b),
            Field::Varint(_) => None,
        }
    }

    fn text(self) -> Option<String> {
        self.bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// The fields of a protobuf message, as (number, value); fixed-width fields are skipped.
pub(crate) fn fields(mut buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    fn varint(buf: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (b, rest) = buf.split_first()?;
            *buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        match key & 7 {
            0 => out.push((key >> 3, Field::Varint(varint(&mut buf)?))),
            1 => buf = buf.get(8..)?,
            2 => {
                let len = usize::try_from(varint(&mut buf)?).ok()?;
                out.push((key >> 3, Field::Bytes(buf.get(..len)?)));
                buf = buf.get(len..)?;
            }
            5 => buf = buf.get(4..)?,
            _ => return None,
        }
    }
    Some(out)
}

/// Whether a request's body is protobuf.
pub(crate) fn is_protobuf(headers: &axum::http::HeaderMap) -> bool {
    headers.get("content-type").is_some_and(|v| {
        v.as_bytes()
            .starts_with(b"application/vnd.kubernetes.protobuf")
    })
}

/// The object inside the `k8s\0` envelope: its (apiVersion, kind) and its bytes.
pub(crate) fn unwrap_envelope(body: &[u8]) -> Option<(String, String, &[u8])> {
    let unknown = fields(body.strip_prefix(b"k8s\0")?)?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (n, f) in unknown {
        match n {
            1 => {
                for (m, g) in fields(f.bytes()?)? {
                    match m {
                        1 => api_version = g.text()?,
                        2 => kind = g.text()?,
                        _ => {}
                    }
                }
            }
            2 => raw = f.bytes()?,
            _ => {}
        }
    }
    Some((api_version, kind, raw))
}

/// A `map<string, V>` entry (key 1, value 2).
fn entry(f: Field<'_>) -> Option<(String, Field<'_>)> {
    let mut key = String::new();
    let mut value = Field::Bytes(&[]);
    for (n, g) in fields(f.bytes()?)? {
        match n {
            1 => key = g.text()?,
            2 => value = g,
            _ => {}
        }
    }
    Some((key, value))
}

/// ObjectMeta: name 1, generateName 2, namespace 3, labels 11, annotations 12.
fn object_meta(buf: &[u8]) -> Option<Value> {
    let mut meta = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    for (n, f) in fields(buf)? {
        match n {
            1 => {
                meta.insert("name".into(), f.text()?.into());
            }
            2 => {
                meta.insert("generateName".into(), f.text()?.into());
            }
            3 => {
                meta.insert("namespace".into(), f.text()?.into());
            }
            11 => {
                let (k, v) = entry(f)?;
                labels.insert(k, v.text()?.into());
            }
            12 => {
                let (k, v) = entry(f)?;
                annotations.insert(k, v.text()?.into());
            }
            _ => {}
        }
    }
    if !labels.is_empty() {
        meta.insert("labels".into(), labels.into());
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), annotations.into());
    }
    Some(meta.into())
}

fn b64(bytes: &[u8]) -> Value {
    base64::engine::general_purpose::STANDARD
        .encode(bytes)
        .into()
}

/// A protobuf body of `plural` (configmaps, secrets) as the JSON object it stands for.
pub(crate) fn decode(plural: &str, body: &[u8]) -> Result<Value, String> {
    let (api_version, kind, raw) =
        unwrap_envelope(body).ok_or("a protobuf body without its k8s envelope")?;
    let bad = || format!("a malformed {kind} in protobuf");
    let mut object = json!({"apiVersion": api_version, "kind": kind});
    let (data_key, binary_key, string_data) = match plural {
        // ConfigMap: metadata 1, data 2 (strings), binaryData 3, immutable 4.
        "configmaps" => ((2, false), Some(3), None),
        // Secret: metadata 1, data 2 (bytes), type 3, stringData 4, immutable 5.
        "secrets" => ((2, true), None, Some(4)),
        other => {
            return Err(format!(
                "the test API server reads protobuf bodies of configmaps and secrets only, not {other}"
            ));
        }
    };
    let (mut data, mut binary, mut strings) = (Map::new(), Map::new(), Map::new());
    for (n, f) in fields(raw).ok_or_else(bad)? {
        match (n, f) {
            (1, f) => {
                object["metadata"] = object_meta(f.bytes().ok_or_else(bad)?).ok_or_else(bad)?
            }
            (n, f) if n == data_key.0 => {
                let (k, v) = entry(f).ok_or_else(bad)?;
                let v = v.bytes().ok_or_else(bad)?;
                let v = if data_key.1 {
                    b64(v)
                } else {
                    String::from_utf8_lossy(v).into_owned().into()
                };
                data.insert(k, v);
            }
            (n, f) if Some(n) == binary_key => {
                let (k, v) = entry(f).ok_or_else(bad)?;
                binary.insert(k, b64(v.bytes().ok_or_else(bad)?));
            }
            (n, f) if Some(n) == string_data => {
                let (k, v) = entry(f).ok_or_else(bad)?;
                strings.insert(k, v.text().ok_or_else(bad)?.into());
            }
            (3, Field::Bytes(t)) if plural == "secrets" => {
                object["type"] = String::from_utf8_lossy(t).into_owned().into();
            }
            (4, Field::Varint(v)) if plural == "configmaps" => {
                object["immutable"] = (v != 0).into()
            }
            (5, Field::Varint(v)) if plural == "secrets" => object["immutable"] = (v != 0).into(),
            _ => {}
        }
    }
    for (key, map) in [
        ("data", data),
        ("binaryData", binary),
        ("stringData", strings),
    ] {
        if !map.is_empty() {
            object[key] = map.into();
        }
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [field(1, api_version.as_bytes()), field(2, kind.as_bytes())].concat();
        let unknown = [field(1, &type_meta), field(2, raw)].concat();
        [b"k8s\0".as_slice(), &unknown].concat()
    }

    /// The bytes kubectl 1.32 sends for `kubectl create configmap cfg --from-literal=a=b`
    /// and `kubectl create secret generic s --from-literal=p=hunter2`, built by field.
    #[test]
    fn a_config_map_and_a_secret_as_kubectl_sends_them() {
        let meta = field(1, &[field(1, b"cfg"), field(3, b"default")].concat());
        let cm = [
            meta.clone(),
            field(2, &[field(1, b"a"), field(2, b"b")].concat()),
        ]
        .concat();
        let got = decode("configmaps", &envelope("v1", "ConfigMap", &cm)).unwrap();
        assert_eq!(
            got,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cfg", "namespace": "default"}, "data": {"a": "b"}})
        );
        let secret = [
            field(1, &field(1, b"s")),
            field(2, &[field(1, b"p"), field(2, b"hunter2")].concat()),
            field(3, b"Opaque"),
        ]
        .concat();
        let got = decode("secrets", &envelope("v1", "Secret", &secret)).unwrap();
        assert_eq!(got["data"]["p"], "aHVudGVyMg==");
        assert_eq!(got["type"], "Opaque");
        assert!(decode("pods", &envelope("v1", "Pod", &[])).is_err());
        assert!(decode("secrets", b"{}").is_err());
    }
}
