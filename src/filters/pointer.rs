//! RFC 6901 JSON pointers, parsed once when a pack is compiled so that the per-request
//! walk is a plain token loop.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    raw: String,
    tokens: Vec<String>,
}

impl Pointer {
    /// Parses `s`; the error is the message a pack author sees.
    pub fn parse(s: &str) -> Result<Pointer, &'static str> {
        if s.is_empty() {
            return Ok(Pointer {
                raw: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err("not a JSON pointer (must start with '/')");
        };
        let mut tokens = Vec::new();
        for raw_token in rest.split('/') {
            let mut token = String::with_capacity(raw_token.len());
            let mut chars = raw_token.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => token.push('~'),
                        Some('1') => token.push('/'),
                        _ => return Err("bad escape in JSON pointer (only ~0 and ~1 are allowed)"),
                    }
                } else {
                    token.push(c);
                }
            }
            tokens.push(token);
        }
        Ok(Pointer {
            raw: s.to_string(),
            tokens,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    pub fn is_root(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn get<'v>(&self, mut v: &'v Value) -> Option<&'v Value> {
        for t in &self.tokens {
            v = match v {
                Value::Object(m) => m.get(t)?,
                Value::Array(a) => a.get(array_index(t)?)?,
                _ => return None,
            };
        }
        Some(v)
    }

    pub fn get_mut<'v>(&self, mut v: &'v mut Value) -> Option<&'v mut Value> {
        for t in &self.tokens {
            v = match v {
                Value::Object(m) => m.get_mut(t)?,
                Value::Array(a) => a.get_mut(array_index(t)?)?,
                _ => return None,
            };
        }
        Some(v)
    }

    /// Walks to the target, turning missing or null members on the way into objects, so an
    /// annotation can land in a record that had no metadata yet. The target itself is left
    /// as found (`Null` when it was created). `None` when a scalar or a short array is in
    /// the way: the caller reports that instead of overwriting client data.
    pub fn get_or_create<'v>(&self, mut v: &'v mut Value) -> Option<&'v mut Value> {
        for t in &self.tokens {
            if v.is_null() {
                *v = Value::Object(serde_json::Map::new());
            }
            v = match v {
                Value::Object(m) => m.entry(t.clone()).or_insert(Value::Null),
                Value::Array(a) => a.get_mut(array_index(t)?)?,
                _ => return None,
            };
        }
        Some(v)
    }

    /// Whether [`Self::get_or_create`] would reach an object or a fresh slot: only objects, or
    /// missing / null members, on the way, and no scalar or array at the end. Does not copy.
    pub fn can_hold_object(&self, mut v: &Value) -> bool {
        for t in &self.tokens {
            v = match v {
                Value::Null => return true,
                Value::Object(m) => match m.get(t) {
                    Some(x) => x,
                    None => return true,
                },
                Value::Array(a) => match array_index(t).and_then(|i| a.get(i)) {
                    Some(x) => x,
                    None => return false,
                },
                _ => return false,
            };
        }
        matches!(v, Value::Null | Value::Object(_))
    }

    /// Removes the target from its parent object; removing the root or an array element is
    /// not supported (the packs never need it) and does nothing.
    pub fn remove(&self, v: &mut Value) -> Option<Value> {
        let (last, parents) = self.tokens.split_last()?;
        let mut cur = v;
        for t in parents {
            cur = match cur {
                Value::Object(m) => m.get_mut(t)?,
                Value::Array(a) => a.get_mut(array_index(t)?)?,
                _ => return None,
            };
        }
        match cur {
            Value::Object(m) => m.remove(last),
            _ => None,
        }
    }
}

fn array_index(t: &str) -> Option<usize> {
    // RFC 6901: no sign, no leading zeros.
    if t.is_empty() || (t.len() > 1 && t.starts_with('0')) || !t.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    t.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parse_and_resolve() {
        let doc = json!({"a": {"b/c": [10, 20], "m~n": 1}, "": 5});
        assert_eq!(Pointer::parse("").unwrap().get(&doc), Some(&doc));
        assert_eq!(
            Pointer::parse("/a/b~1c/1").unwrap().get(&doc),
            Some(&json!(20))
        );
        assert_eq!(
            Pointer::parse("/a/m~0n").unwrap().get(&doc),
            Some(&json!(1))
        );
        assert_eq!(Pointer::parse("/").unwrap().get(&doc), Some(&json!(5)));
        assert_eq!(Pointer::parse("/a/b~1c/01").unwrap().get(&doc), None);
        assert_eq!(Pointer::parse("/a/b~1c/2").unwrap().get(&doc), None);
        assert!(Pointer::parse("a").is_err());
        assert!(Pointer::parse("/a~2").is_err());
        assert!(Pointer::parse("/a~").is_err());
    }

    #[test]
    fn create_and_remove() {
        let mut doc = json!({"x": null, "s": "str"});
        let p = Pointer::parse("/x/y/z").unwrap();
        *p.get_or_create(&mut doc).unwrap() = json!(1);
        assert_eq!(doc, json!({"x": {"y": {"z": 1}}, "s": "str"}));
        assert!(Pointer::parse("/s/t")
            .unwrap()
            .get_or_create(&mut doc)
            .is_none());
        assert!(!Pointer::parse("/s/t").unwrap().can_hold_object(&doc));
        assert!(!Pointer::parse("/s").unwrap().can_hold_object(&doc));
        assert!(Pointer::parse("/x/y").unwrap().can_hold_object(&doc));
        assert!(Pointer::parse("/q/r").unwrap().can_hold_object(&doc));
        assert_eq!(p.remove(&mut doc), Some(json!(1)));
        assert_eq!(doc, json!({"x": {"y": {}}, "s": "str"}));
    }
}
