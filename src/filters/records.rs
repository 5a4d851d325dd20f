//! Records in request and response bodies, as a route's shape describes them: extraction for
//! evaluation, the rewrite that keeps only admitted records (every parallel array in lockstep),
//! and retrieval treatment of read answers.

use super::pointer::Pointer;
use super::{AnnotationStyle, CompiledRoute, Layout, RouteKind, Shape};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// One record of a write: what the gate turns into a signal.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Position in the request (the order of ids / rows); the key for [`CompiledRoute::rewrite_admitted`].
    pub index: usize,
    /// The record's id as a string (numbers in decimal), when the body or path names it.
    pub id: Option<String>,
    /// The record's text: a string as sent, anything else as compact JSON.
    pub text: Option<String>,
    /// The record's metadata / payload, without the pack's `exclude` members.
    pub metadata: Option<Value>,
}

impl Record {
    /// What the kernel inspects: the text, or when there is none (a payload-only Qdrant point,
    /// a metadata update, a delete by filter) the compact JSON of the metadata, so no write
    /// goes unread.
    pub fn signal_text(&self) -> Cow<'_, str> {
        match (&self.text, &self.metadata) {
            (Some(t), _) if !t.is_empty() => Cow::Borrowed(t),
            (_, Some(m)) if !m.is_null() => Cow::Owned(m.to_string()),
            (Some(t), _) => Cow::Borrowed(t),
            (None, _) => Cow::Borrowed(""),
        }
    }
}

/// A body that does not have the shape its route says: the client's mistake, a 400.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExtractError {
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("line {line} of the NDJSON body is not valid JSON: {message}")]
    InvalidNdjson { line: usize, message: String },
    #[error("`{pointer}` is missing from the request body")]
    Missing { pointer: String },
    #[error("`{pointer}` is not an array")]
    NotAnArray { pointer: String },
    #[error("`{pointer}` has {found} elements, but there are {expected} ids")]
    LengthMismatch {
        pointer: String,
        expected: usize,
        found: usize,
    },
    #[error("record {index} is not a JSON object")]
    RecordNotObject { index: usize },
    #[error("the id of record {index} is not a string or a number")]
    BadId { index: usize },
    #[error("the metadata of record {index} is not a JSON object")]
    MetadataNotObject { index: usize },
    #[error("record index {index} is out of range: the body has {len} records")]
    IndexOutOfRange { index: usize, len: usize },
    #[error("no record admitted: a single-record body cannot be forwarded without its record")]
    NothingAdmitted,
}

/// Whether a metadata key reads as the gate's annotation `key` (nested style: the key itself;
/// flat style: also `key_...`) once NFKC-normalized, stripped of invisible characters and
/// lower-cased: `_INTEGRITY_DECISION`, `_integ\u{200B}rity` and a full-width `＿integrity` all do.
fn reads_as_annotation(k: &str, key: &str, flat: bool) -> bool {
    use unicode_normalization::UnicodeNormalization;
    let reads_as = |k: &str| {
        k.eq_ignore_ascii_case(key)
            || (flat
                && k.len() > key.len()
                && k.as_bytes()[key.len()] == b'_'
                && k[..key.len()].eq_ignore_ascii_case(key))
    };
    if k.is_ascii() {
        return reads_as(k);
    }
    let folded: String = k
        .nfkc()
        .filter(|c| !crate::kernel::detectors::is_invisible(*c))
        .collect::<String>()
        .to_lowercase();
    reads_as(&folded)
}

/// What retrieval treatment does with one record of a read answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Treatment {
    Include,
    /// Keep, and mark as untrusted where the pack says annotations go.
    Warn,
    /// Drop from the answer (quarantined, revoked, tombstoned).
    Exclude,
}

/// The member written into metadata to mark a `Warn` record of a read answer.
const RETRIEVAL_FIELD: &str = "retrieval";
const RETRIEVAL_MARK: &str = "untrusted";

/// Where the records of one body are, found once and shared by extract and rewrite so both
/// always agree.
#[derive(Clone, Copy)]
enum Located<'s> {
    /// No records to pick from: the whole body is one record (layout `none`, or a delete whose
    /// ids are absent because it deletes by filter).
    Whole,
    Columnar(&'s Shape, usize),
    Rows(&'s Shape, usize),
    Single(&'s Shape),
}

impl Located<'_> {
    fn len(&self) -> usize {
        match self {
            Located::Whole | Located::Single(_) => 1,
            Located::Columnar(_, n) | Located::Rows(_, n) => *n,
        }
    }
}

fn id_string(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The record's text with the values of the shape's `scan` pointers appended, one per line.
fn with_scanned<'v>(
    text: Option<String>,
    scanned: impl Iterator<Item = &'v Value>,
) -> Option<String> {
    let mut out = text;
    for v in scanned {
        if let Some(more) = text_of(Some(v)).filter(|m| !m.is_empty()) {
            match &mut out {
                Some(t) if !t.is_empty() => {
                    t.push('\n');
                    t.push_str(&more);
                }
                _ => out = Some(more),
            }
        }
    }
    out
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

impl CompiledRoute {
    fn locate<'s>(&'s self, body: &Value) -> Result<Located<'s>, ExtractError> {
        let shape = self.shape_for(body);
        let absent = |ptr: &Pointer| {
            if self.kind == RouteKind::Delete {
                Ok(Located::Whole)
            } else {
                Err(ExtractError::Missing {
                    pointer: ptr.as_str().to_string(),
                })
            }
        };
        match shape.layout {
            Layout::None => Ok(Located::Whole),
            Layout::Columnar => {
                let Some(idp) = shape.id.as_ref() else {
                    return Ok(Located::Whole);
                };
                let n = match present(idp.get(body)) {
                    None => return absent(idp),
                    Some(Value::Array(a)) => a.len(),
                    Some(_) => {
                        return Err(ExtractError::NotAnArray {
                            pointer: idp.as_str().to_string(),
                        })
                    }
                };
                for p in &shape.lockstep {
                    check_lockstep(shape, p, body, n)?;
                }
                Ok(Located::Columnar(shape, n))
            }
            Layout::Rows | Layout::Ndjson => match present(shape.records.get(body)) {
                None => absent(&shape.records),
                Some(Value::Array(a)) => Ok(Located::Rows(shape, a.len())),
                // A lone object where a list of rows is expected is one record (Milvus: `data`
                // is "an entity object or an array of entity objects"); judged and rewritten as
                // a single-record body.
                Some(Value::Object(_)) if shape.layout == Layout::Rows => {
                    Ok(Located::Single(shape))
                }
                Some(_) => Err(ExtractError::NotAnArray {
                    pointer: shape.records.as_str().to_string(),
                }),
            },
            Layout::Single => match present(shape.records.get(body)) {
                None => absent(&shape.records),
                Some(Value::Object(_)) => Ok(Located::Single(shape)),
                Some(_) => Err(ExtractError::RecordNotObject { index: 0 }),
            },
        }
    }

    /// How many records [`CompiledRoute::extract_records`] would find in `body`, found without
    /// building them: a request over the record cap is refused before any record is made.
    pub fn record_count(&self, body: &Value) -> Result<usize, ExtractError> {
        Ok(match self.locate(body)? {
            Located::Whole | Located::Single(_) => 1,
            Located::Columnar(_, n) | Located::Rows(_, n) => n,
        })
    }

    /// The records of a write or delete body, in request order. See [`Record`].
    pub fn extract_records(&self, body: &Value) -> Result<Vec<Record>, ExtractError> {
        match self.locate(body)? {
            Located::Whole => Ok(vec![Record {
                index: 0,
                id: None,
                text: None,
                metadata: present(Some(body)).cloned(),
            }]),
            Located::Columnar(shape, n) => {
                let column = |p: &Option<Pointer>| -> Option<&Vec<Value>> {
                    p.as_ref()?.get(body)?.as_array()
                };
                let ids = column(&shape.id);
                let texts = column(&shape.text);
                let metas = column(&shape.metadata);
                let scans: Vec<&Vec<Value>> = shape
                    .scan
                    .iter()
                    .filter_map(|p| p.get(body)?.as_array())
                    .collect();
                (0..n)
                    .map(|i| {
                        let id = match ids.and_then(|a| a.get(i)) {
                            Some(v) => Some(
                                id_string(v)
                                    .ok_or(ExtractError::BadId { index: i })?
                                    .into_owned(),
                            ),
                            None => None,
                        };
                        Ok(Record {
                            index: i,
                            id,
                            text: with_scanned(
                                text_of(texts.and_then(|a| a.get(i))),
                                scans.iter().filter_map(|a| a.get(i)),
                            ),
                            metadata: present(metas.and_then(|a| a.get(i))).cloned(),
                        })
                    })
                    .collect()
            }
            Located::Rows(shape, _) => {
                let rows = shape
                    .records
                    .get(body)
                    .and_then(Value::as_array)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                rows.iter()
                    .enumerate()
                    .map(|(i, row)| record_of(shape, row, i))
                    .collect()
            }
            Located::Single(shape) => match shape.records.get(body) {
                Some(rec) => Ok(vec![record_of(shape, rec, 0)?]),
                None => Err(ExtractError::RecordNotObject { index: 0 }),
            },
        }
    }

    /// The body to forward: only the records at the `admitted` indexes (in their original
    /// order), every lockstep array filtered alike, annotation fields written into each
    /// admitted record's metadata when the route has `annotate` (ignored otherwise), and every
    /// other member of the body untouched. With `annotate`, `_integrity` members a client sent
    /// itself are removed from admitted records first, so an annotation is always the gate's.
    ///
    /// Rows and columnar bodies may end up with no records; a single-record body with nothing
    /// admitted is [`ExtractError::NothingAdmitted`]: do not forward it. When every record is
    /// admitted and no annotation is due, the original bytes can be forwarded as they are.
    pub fn rewrite_admitted(
        &self,
        body: &Value,
        admitted: &[(usize, Option<Map<String, Value>>)],
    ) -> Result<Value, ExtractError> {
        let mut out = body.clone();
        self.rewrite_admitted_in_place(&mut out, admitted)?;
        Ok(out)
    }

    /// [`Self::rewrite_admitted`] without the copy, for a body the caller owns. On error the
    /// body is unchanged.
    pub fn rewrite_admitted_in_place(
        &self,
        body: &mut Value,
        admitted: &[(usize, Option<Map<String, Value>>)],
    ) -> Result<(), ExtractError> {
        let located = self.locate(body)?;
        let len = located.len();
        let mut keep = vec![false; len];
        let mut notes: Vec<Option<&Map<String, Value>>> = vec![None; len];
        for (i, note) in admitted {
            if *i >= len {
                return Err(ExtractError::IndexOutOfRange { index: *i, len });
            }
            keep[*i] = true;
            notes[*i] = note.as_ref();
        }
        let annotating = self.annotate;
        match located {
            Located::Whole => {
                if !keep[0] {
                    return Err(ExtractError::NothingAdmitted);
                }
                Ok(())
            }
            Located::Single(shape) => {
                if !keep[0] {
                    return Err(ExtractError::NothingAdmitted);
                }
                let Some(rec) = shape.records.get_mut(body) else {
                    return Ok(());
                };
                if annotating {
                    self.check_annotatable(shape, rec, 0)?;
                    self.annotate_record(shape, rec, notes[0]);
                }
                Ok(())
            }
            Located::Rows(shape, _) => {
                let Some(Value::Array(rows)) = shape.records.get_mut(body) else {
                    return Ok(());
                };
                if annotating {
                    for (i, row) in rows.iter().enumerate() {
                        if keep[i] {
                            self.check_annotatable(shape, row, i)?;
                        }
                    }
                }
                retain_by_mask(rows, &keep);
                if annotating {
                    let kept = (0..len).filter(|&i| keep[i]);
                    for (row, i) in rows.iter_mut().zip(kept) {
                        self.annotate_record(shape, row, notes[i]);
                    }
                }
                Ok(())
            }
            Located::Columnar(shape, _) => {
                let meta_ptr = shape.metadata.as_ref().filter(|_| annotating);
                if let Some(mp) = meta_ptr {
                    if let Some(Value::Array(metas)) = mp.get(body) {
                        for (i, m) in metas.iter().enumerate() {
                            if keep[i] && !matches!(m, Value::Null | Value::Object(_)) {
                                return Err(ExtractError::MetadataNotObject { index: i });
                            }
                        }
                    } else if !mp.can_hold_object(body) {
                        return Err(ExtractError::MetadataNotObject { index: 0 });
                    }
                }
                for p in &shape.lockstep {
                    if let Some(v) = p.get_mut(body) {
                        retain_column(v, &keep);
                    }
                }
                if let Some(mp) = meta_ptr {
                    let kept: Vec<usize> = (0..len).filter(|&i| keep[i]).collect();
                    if kept.iter().any(|&i| notes[i].is_some()) {
                        if let Some(slot) = mp.get_or_create(body) {
                            if slot.is_null() {
                                *slot = Value::Array(vec![Value::Null; kept.len()]);
                            }
                        }
                    }
                    // Without any note an absent metadata column stays absent; existing ones
                    // are still cleaned of client-sent annotations.
                    if let Some(Value::Array(metas)) = mp.get_mut(body) {
                        for (m, &i) in metas.iter_mut().zip(&kept) {
                            self.strip_and_annotate(m, notes[i]);
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// Retrieval treatment for a read answer: drops `Exclude` records, marks `Warn` ones when
    /// the route has `annotate` (in a row's metadata, created if absent; in a columnar answer
    /// only when its metadata column was returned, since the client did not ask for it), and keeps
    /// every parallel and nested array consistent (Chroma's query answers hold one list per
    /// query). Records without an id are kept. Returns how many records were dropped.
    ///
    /// A `single` read whose record is excluded has the record replaced by `null`: the caller
    /// should answer 404 instead.
    pub fn filter_response(&self, body: &mut Value, treat: &dyn Fn(&str) -> Treatment) -> usize {
        if self.kind != RouteKind::Read {
            return 0;
        }
        let shape = self.shape_for(body);
        match shape.layout {
            Layout::None | Layout::Ndjson => 0,
            Layout::Columnar => self.filter_columnar(shape, body, treat),
            Layout::Rows => self.filter_rows(shape, body, treat),
            Layout::Single => {
                let Some(rec) = shape.records.get_mut(body) else {
                    return 0;
                };
                match self.treat_record(shape, rec, treat) {
                    Treatment::Exclude => {
                        *rec = Value::Null;
                        1
                    }
                    Treatment::Warn => {
                        self.mark_record(shape, rec);
                        0
                    }
                    Treatment::Include => 0,
                }
            }
        }
    }

    /// The ids of the records in a read answer (all groups), for readback checks.
    pub fn response_record_ids(&self, body: &Value) -> Vec<String> {
        let mut out = Vec::new();
        let shape = self.shape_for(body);
        let mut push = |v: Option<&Value>| {
            if let Some(s) = v.and_then(id_string) {
                out.push(s.into_owned());
            }
        };
        match shape.layout {
            Layout::Columnar => {
                if let Some(Value::Array(ids)) = shape.id.as_ref().and_then(|p| p.get(body)) {
                    for v in ids {
                        match v {
                            Value::Array(group) => group.iter().for_each(|x| push(Some(x))),
                            other => push(Some(other)),
                        }
                    }
                }
            }
            Layout::Rows => {
                fn id_of<'v>(shape: &Shape, row: &'v Value) -> Option<&'v Value> {
                    shape.id.as_ref().and_then(|p| p.get(row))
                }
                match shape.records.get(body) {
                    Some(Value::Array(rows)) => {
                        for r in rows {
                            match r {
                                Value::Array(group) => {
                                    group.iter().for_each(|x| push(id_of(shape, x)))
                                }
                                row => push(id_of(shape, row)),
                            }
                        }
                    }
                    Some(Value::Object(map)) => {
                        map.values().for_each(|row| push(id_of(shape, row)))
                    }
                    _ => {}
                }
            }
            Layout::Single => {
                if let Some(rec) = present(shape.records.get(body)) {
                    push(shape.id.as_ref().and_then(|p| p.get(rec)));
                }
            }
            Layout::None | Layout::Ndjson => {}
        }
        out
    }

    /// Parses a request body as this route expects it: NDJSON becomes an array of the line
    /// values, an empty body becomes `null` (a DELETE without one), anything else is JSON.
    pub fn parse_body(&self, bytes: &[u8]) -> Result<Value, ExtractError> {
        if self.is_ndjson() {
            let mut rows = Vec::new();
            for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let v = strict_json(line).map_err(|e| ExtractError::InvalidNdjson {
                    line: i + 1,
                    message: e.to_string(),
                })?;
                rows.push(v);
            }
            return Ok(Value::Array(rows));
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        strict_json(bytes).map_err(|e| ExtractError::InvalidJson(e.to_string()))
    }

    /// Serializes a (rewritten) body in the route's wire format.
    pub fn serialize_body(&self, body: &Value) -> Vec<u8> {
        if self.is_ndjson() {
            if let Value::Array(rows) = body {
                let mut out = Vec::new();
                for r in rows {
                    out.extend_from_slice(r.to_string().as_bytes());
                    out.push(b'\n');
                }
                return out;
            }
        }
        body.to_string().into_bytes()
    }

    fn check_annotatable(
        &self,
        shape: &Shape,
        rec: &Value,
        index: usize,
    ) -> Result<(), ExtractError> {
        match &shape.metadata {
            Some(mp) if !mp.can_hold_object(rec) => Err(ExtractError::MetadataNotObject { index }),
            _ => Ok(()),
        }
    }

    fn annotate_record(&self, shape: &Shape, rec: &mut Value, note: Option<&Map<String, Value>>) {
        let Some(mp) = &shape.metadata else { return };
        if note.is_none() && present(mp.get(rec)).is_none() {
            return;
        }
        if let Some(slot) = mp.get_or_create(rec) {
            self.strip_and_annotate(slot, note);
        }
    }

    /// Removes client-sent annotation members from one metadata value and writes the gate's.
    fn strip_and_annotate(&self, m: &mut Value, note: Option<&Map<String, Value>>) {
        if m.is_null() {
            if note.is_none() {
                return;
            }
            *m = Value::Object(Map::new());
        }
        let Value::Object(obj) = m else { return };
        let key = self.annotation_key.as_str();
        let flat = self.annotation == AnnotationStyle::Flat;
        // A client may not write into the gate's namespace under a spelling a reader takes for
        // it: keys are compared after NFKC, without invisible characters and case-folded.
        obj.retain(|k, _| !reads_as_annotation(k, key, flat));
        match self.annotation {
            AnnotationStyle::Nested => {
                if let Some(n) = note {
                    obj.insert(key.to_string(), Value::Object(n.clone()));
                }
            }
            AnnotationStyle::Flat => {
                if let Some(n) = note {
                    for (k, v) in n {
                        let v = match v {
                            Value::Null => continue,
                            Value::Array(_) | Value::Object(_) => Value::String(v.to_string()),
                            scalar => scalar.clone(),
                        };
                        obj.insert(format!("{key}_{k}"), v);
                    }
                }
            }
        }
    }

    fn mark(&self, m: &mut Value) {
        if m.is_null() {
            *m = Value::Object(Map::new());
        }
        let Value::Object(obj) = m else { return };
        let key = &self.annotation_key;
        let mark = Value::String(RETRIEVAL_MARK.to_string());
        match self.annotation {
            AnnotationStyle::Nested => {
                let slot = obj
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Value::Object(inner) = slot {
                    inner.insert(RETRIEVAL_FIELD.to_string(), mark);
                }
            }
            AnnotationStyle::Flat => {
                obj.insert(format!("{key}_{RETRIEVAL_FIELD}"), mark);
            }
        }
    }

    fn mark_record(&self, shape: &Shape, rec: &mut Value) {
        if !self.annotate {
            return;
        }
        // A warning the consumer cannot see is no warning: a row without metadata gets some.
        if let Some(mp) = shape.metadata.as_ref().filter(|mp| mp.can_hold_object(rec)) {
            if let Some(m) = mp.get_or_create(rec) {
                self.mark(m);
            }
        }
    }

    fn treat_record(
        &self,
        shape: &Shape,
        rec: &Value,
        treat: &dyn Fn(&str) -> Treatment,
    ) -> Treatment {
        match shape
            .id
            .as_ref()
            .and_then(|p| p.get(rec))
            .and_then(id_string)
        {
            Some(id) => treat(&id),
            None => Treatment::Include,
        }
    }

    fn filter_rows(
        &self,
        shape: &Shape,
        body: &mut Value,
        treat: &dyn Fn(&str) -> Treatment,
    ) -> usize {
        let Some(records) = shape.records.get_mut(body) else {
            return 0;
        };
        match records {
            Value::Array(rows) if !rows.is_empty() && rows.iter().all(Value::is_array) => {
                // One list of hits per query (Qdrant search/batch, Milvus multi-vector search).
                let mut dropped = 0;
                for group in rows.iter_mut() {
                    if let Value::Array(g) = group {
                        dropped += self.filter_row_list(shape, g, treat);
                    }
                }
                dropped
            }
            Value::Array(rows) => self.filter_row_list(shape, rows, treat),
            Value::Object(map) => {
                // Records keyed by id (Pinecone fetch): the key names the record when the row
                // itself does not.
                let mut dropped = 0;
                map.retain(|key, row| {
                    let t = match shape
                        .id
                        .as_ref()
                        .and_then(|p| p.get(row))
                        .and_then(id_string)
                    {
                        Some(id) => treat(&id),
                        None => treat(key),
                    };
                    self.apply_to_row(shape, row, t, &mut dropped)
                });
                dropped
            }
            _ => 0,
        }
    }

    fn filter_row_list(
        &self,
        shape: &Shape,
        rows: &mut Vec<Value>,
        treat: &dyn Fn(&str) -> Treatment,
    ) -> usize {
        let mut dropped = 0;
        rows.retain_mut(|row| {
            let t = self.treat_record(shape, row, treat);
            self.apply_to_row(shape, row, t, &mut dropped)
        });
        dropped
    }

    /// Whether to keep the row; marks it when warned, counts it when dropped.
    fn apply_to_row(
        &self,
        shape: &Shape,
        row: &mut Value,
        t: Treatment,
        dropped: &mut usize,
    ) -> bool {
        match t {
            Treatment::Include => true,
            Treatment::Warn => {
                self.mark_record(shape, row);
                true
            }
            Treatment::Exclude => {
                *dropped += 1;
                false
            }
        }
    }

    fn filter_columnar(
        &self,
        shape: &Shape,
        body: &mut Value,
        treat: &dyn Fn(&str) -> Treatment,
    ) -> usize {
        let Some(Value::Array(ids)) = shape.id.as_ref().and_then(|p| p.get(body)) else {
            return 0;
        };
        let treat_id = |v: &Value| match id_string(v) {
            Some(id) => treat(&id),
            None => Treatment::Include,
        };
        let grouped = !ids.is_empty() && ids.iter().all(Value::is_array);
        let groups: Vec<Vec<Treatment>> = if grouped {
            ids.iter()
                .map(|g| {
                    g.as_array()
                        .map(|a| a.iter().map(treat_id).collect())
                        .unwrap_or_default()
                })
                .collect()
        } else {
            vec![ids.iter().map(treat_id).collect()]
        };
        let dropped = groups
            .iter()
            .flatten()
            .filter(|t| **t == Treatment::Exclude)
            .count();
        let warned = self.annotate && groups.iter().flatten().any(|t| *t == Treatment::Warn);
        if dropped == 0 && !warned {
            return 0;
        }
        let masks: Vec<Vec<bool>> = groups
            .iter()
            .map(|g| g.iter().map(|t| *t != Treatment::Exclude).collect())
            .collect();
        for p in &shape.lockstep {
            let Some(v) = p.get_mut(body) else { continue };
            if grouped {
                if let Value::Array(outer) = v {
                    for (inner, mask) in outer.iter_mut().zip(&masks) {
                        retain_column(inner, mask);
                    }
                }
            } else {
                retain_column(v, &masks[0]);
            }
        }
        if warned {
            let Some(Value::Array(metas)) = shape.metadata.as_ref().and_then(|p| p.get_mut(body))
            else {
                return dropped;
            };
            let mark_group = |metas: &mut Vec<Value>, ts: &[Treatment]| {
                let kept = ts.iter().filter(|t| **t != Treatment::Exclude);
                for (m, t) in metas.iter_mut().zip(kept) {
                    if *t == Treatment::Warn {
                        self.mark(m);
                    }
                }
            };
            if grouped {
                for (inner, ts) in metas.iter_mut().zip(&groups) {
                    if let Value::Array(a) = inner {
                        mark_group(a, ts);
                    }
                }
            } else {
                mark_group(metas, &groups[0]);
            }
        }
        dropped
    }
}

fn record_of(shape: &Shape, rec: &Value, index: usize) -> Result<Record, ExtractError> {
    if !rec.is_object() {
        return Err(ExtractError::RecordNotObject { index });
    }
    let named = |p: &Option<Pointer>| present(p.as_ref().and_then(|p| p.get(rec)));
    let id = match named(&shape.id).or_else(|| named(&shape.id_alias)) {
        None => None,
        Some(v) => Some(
            id_string(v)
                .ok_or(ExtractError::BadId { index })?
                .into_owned(),
        ),
    };
    let metadata = present(shape.metadata.as_ref().and_then(|p| p.get(rec))).map(|m| {
        let mut m = m.clone();
        for p in &shape.exclude {
            p.remove(&mut m);
        }
        m
    });
    Ok(Record {
        index,
        id,
        text: with_scanned(
            text_of(shape.text.as_ref().and_then(|p| p.get(rec))),
            shape.scan.iter().filter_map(|p| p.get(rec)),
        ),
        metadata,
    })
}

/// A lockstep column must hold one element per id; an object of such arrays (Qdrant's named
/// vectors) is checked member by member.
fn check_lockstep(shape: &Shape, p: &Pointer, body: &Value, n: usize) -> Result<(), ExtractError> {
    let len_ok = |v: &Value, pointer: String| match v {
        Value::Array(a) if a.len() == n => Ok(()),
        Value::Array(a) => Err(ExtractError::LengthMismatch {
            pointer,
            expected: n,
            found: a.len(),
        }),
        _ => Err(ExtractError::NotAnArray { pointer }),
    };
    let is_named = |o: &Option<Pointer>| o.as_ref() == Some(p);
    match present(p.get(body)) {
        None => Ok(()),
        Some(Value::Object(members))
            if !is_named(&shape.id) && !is_named(&shape.text) && !is_named(&shape.metadata) =>
        {
            for (k, v) in members {
                len_ok(v, format!("{}/{}", p.as_str(), k))?;
            }
            Ok(())
        }
        Some(v) => len_ok(v, p.as_str().to_string()),
    }
}

fn retain_by_mask(a: &mut Vec<Value>, keep: &[bool]) {
    let mut i = 0;
    a.retain(|_| {
        let k = keep.get(i).copied().unwrap_or(true);
        i += 1;
        k
    });
}

/// Filters one lockstep column (or each array member of an object column); a column whose
/// length does not match is left alone rather than guessed at.
fn retain_column(v: &mut Value, keep: &[bool]) {
    match v {
        Value::Array(a) if a.len() == keep.len() => retain_by_mask(a, keep),
        Value::Object(members) => {
            for m in members.values_mut() {
                if let Value::Array(a) = m {
                    if a.len() == keep.len() {
                        retain_by_mask(a, keep);
                    }
                }
            }
        }
        _ => {}
    }
}

/// Parses JSON as `serde_json::from_slice` does, but refuses an object that names a member
/// twice. Parsers disagree on which of two members wins (serde_json keeps the last, others the
/// first, Chroma refuses the body): a body the gate judged one way must not reach a store that
/// reads it another, so a write body with a duplicate member is the client's mistake (400).
pub fn strict_json(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(v)
}

/// A [`Value`] whose objects name each member once (see [`strict_json`]).
struct Strict;

impl<'de> serde::de::DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Strict {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format_args!(
                    "member {key:?} appears twice in one object"
                )));
            }
            let v = map.next_value_seed(Strict)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod strict_tests {
    use super::strict_json;
    use serde_json::json;

    #[test]
    fn strict_json_reads_what_serde_json_reads_and_refuses_duplicate_members() {
        for text in [
            r#"{"ids":["a"],"documents":["x"],"n":[1,-2,3.5,1e3,null,true,{"a":{"b":[]}}]}"#,
            r#"[{"a":1},{"a":2}]"#,
            r#""\u00e9\n""#,
            "18446744073709551615",
            "-9223372036854775808",
        ] {
            let ours = strict_json(text.as_bytes()).unwrap();
            let theirs: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(ours, theirs, "{text}");
        }
        assert_eq!(strict_json(b"{}").unwrap(), json!({}));
        for dup in [
            r#"{"documents":["poison"],"documents":["benign"]}"#,
            r#"{"ids":["a"],"metadatas":[{"k":1,"k":2}]}"#,
            r#"{"a":1,"\u0061":2}"#,
        ] {
            let e = strict_json(dup.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("appears twice"), "{dup}: {e}");
        }
        assert!(strict_json(b"{} x").is_err());
        assert!(strict_json(b"[1,]").is_err());
    }
}
