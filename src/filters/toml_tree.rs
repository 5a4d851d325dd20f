//! A TOML document read as a tree in which every value keeps its byte span, so pack
//! validation can collect every problem with its line instead of stopping at the first one
//! serde reports.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;
use std::ops::Range;

#[derive(Debug)]
pub struct Node {
    pub span: Range<usize>,
    pub kind: Kind,
}

#[derive(Debug)]
pub enum Kind {
    Str(String),
    Int(i64),
    Float,
    Bool(bool),
    Array(Vec<Node>),
    Table(Vec<(String, Node)>),
}

impl Kind {
    pub fn describe(&self) -> &'static str {
        match self {
            Kind::Str(_) => "a string",
            Kind::Int(_) => "an integer",
            Kind::Float => "a float",
            Kind::Bool(_) => "a boolean",
            Kind::Array(_) => "an array",
            Kind::Table(_) => "a table",
        }
    }
}

/// Parses `text`; the error carries toml's message and the byte span it points at.
pub fn parse(text: &str) -> Result<Node, (String, Option<Range<usize>>)> {
    toml::from_str::<Node>(text).map_err(|e| {
        let msg = e.message().trim().to_string();
        // toml hands datetimes to the visitor outside the span wrapper; no pack field takes one.
        let msg = if msg.contains("expected a spanned value") {
            "dates and times are not allowed in a filter pack".to_string()
        } else if msg.is_empty() {
            // toml gives no description for some errors (`key =` at the end of the file).
            "not valid TOML here (an incomplete key, value or table?)".to_string()
        } else {
            msg
        };
        (msg, e.span())
    })
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a TOML value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        Ok(Kind::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Kind, E> {
        Ok(Kind::Str(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
        Ok(Kind::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
        i64::try_from(v)
            .map(Kind::Int)
            .map_err(|_| E::custom("integer out of range"))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Kind, E> {
        Ok(Kind::Float)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Kind, E> {
        Ok(Kind::Bool(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut items = Vec::new();
        while let Some(n) = seq.next_element::<Node>()? {
            items.push(n);
        }
        Ok(Kind::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value::<Node>()?;
            entries.push((k, v));
        }
        Ok(Kind::Table(entries))
    }
}

struct KindSeed(Kind);

impl<'de> Deserialize<'de> for KindSeed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(KindVisitor).map(KindSeed)
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = toml::Spanned::<KindSeed>::deserialize(d)?;
        Ok(Node {
            span: s.span(),
            kind: s.into_inner().0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_point_at_values_and_tables() {
        let text = "[pack]\nname = \"x\"\n\n[[route]]\nname = \"a\"\nlist = [\"/x\", 2]\n";
        let root = parse(text).unwrap();
        let Kind::Table(top) = &root.kind else {
            panic!("root is a table")
        };
        let (_, routes) = top.iter().find(|(k, _)| k == "route").unwrap();
        let Kind::Array(routes) = &routes.kind else {
            panic!("route is an array")
        };
        assert!(text[routes[0].span.start..].starts_with("[[route]]"));
        let Kind::Table(r0) = &routes[0].kind else {
            panic!()
        };
        assert_eq!(&text[r0[0].1.span.clone()], "\"a\"");
        let Kind::Array(list) = &r0[1].1.kind else {
            panic!()
        };
        assert!(matches!(list[1].kind, Kind::Int(_)));
    }

    #[test]
    fn syntax_and_datetime_errors_have_spans() {
        let (msg, span) = parse("a = [1,\n").unwrap_err();
        assert!(!msg.is_empty());
        assert!(span.is_some());
        let (msg, span) = parse("a = 1\nd = 1979-05-27\n").unwrap_err();
        assert_eq!(msg, "dates and times are not allowed in a filter pack");
        assert_eq!(span, Some(10..20));
    }
}
