//! Filter packs: TOML descriptions of an upstream store's HTTP API (which requests are writes,
//! deletes and reads, and where the records sit in their JSON bodies), compiled at load into a
//! [`RouteTable`] that the proxy consults per request. The pack format is documented in
//! `filters/README.md`; this module owns compiling, matching, record extraction, rewriting of
//! admitted writes and retrieval treatment of read answers. It does no I/O.

mod compile;
mod pointer;
mod records;
mod table;
mod toml_tree;

pub use compile::{compile_pack, MUTATIONS, SUBSTRATES};
pub use pointer::Pointer;
pub use records::{ExtractError, Record, Treatment};
pub use table::{build_table, ReadbackRequest, RouteMatch, RouteTable};

/// What a matched request means to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteKind {
    /// Adds or changes records: every record is evaluated before anything is forwarded.
    Write,
    /// Removes records: evaluated like a write (a delete can erase good knowledge).
    Delete,
    /// Returns records: never evaluated, only given retrieval treatment.
    Read,
    /// Changes the store but carries no record the gate judges (creating a tenant, a database,
    /// an index; loading a collection): forwarded as it is. A mutating request that no route
    /// describes is refused unless the operator forwards such requests
    /// (`proxy.undescribed_mutations`).
    Forward,
}

impl RouteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteKind::Write => "write",
            RouteKind::Delete => "delete",
            RouteKind::Read => "read",
            RouteKind::Forward => "forward",
        }
    }
}

/// How the records are laid out in a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Parallel arrays, one element per record (Chroma: `ids[]`, `documents[]`, ...).
    Columnar,
    /// An array of record objects (Qdrant `points[]`, Pinecone `vectors[]`, ...).
    Rows,
    /// The body (or the value at `records`) is one record.
    Single,
    /// Newline-delimited JSON, one record object per line (Pinecone records upsert).
    Ndjson,
    /// No records in the body (a delete by path, a pass-through read).
    None,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Columnar => "columnar",
            Layout::Rows => "rows",
            Layout::Single => "single",
            Layout::Ndjson => "ndjson",
            Layout::None => "none",
        }
    }
}

/// How `_integrity` annotations are written into a record's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnotationStyle {
    /// `{"_integrity": {"decision": ..., "receipt": ...}}`: for stores with JSON payloads.
    Nested,
    /// `"_integrity_decision": ..., "_integrity_receipt": ...`: for stores whose metadata
    /// values must be scalars (Chroma, Pinecone).
    Flat,
}

/// Where a route finds the name of the collection its records belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CollectionRef {
    /// A path parameter of the route's template.
    Param(String),
    /// A string (or number) in the request body.
    Body(Pointer),
    /// A query parameter of the request (`?namespace=`), percent-decoded.
    Query(String),
}

/// Where the records are in a body. Pointers are relative to the body for `columnar`, and
/// relative to each record for `rows`, `single` and `ndjson`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub layout: Layout,
    /// The array of rows (`rows`) or the one record (`single`); the root otherwise.
    pub records: Pointer,
    pub id: Option<Pointer>,
    /// Where the id is when `id` names nothing (`rows`, `single`, `ndjson`): a store that
    /// accepts two spellings of the id member (Pinecone records: `_id` or `id`).
    pub id_alias: Option<Pointer>,
    pub text: Option<Pointer>,
    pub metadata: Option<Pointer>,
    /// `columnar` only: every array filtered in lockstep with the ids (id, text and metadata
    /// arrays included, whether the pack lists them or not).
    pub lockstep: Vec<Pointer>,
    /// Members of the metadata left out of [`Record::metadata`] (e.g. the vector of a Milvus
    /// row, whose metadata is the whole row).
    pub exclude: Vec<Pointer>,
    /// More values the kernel reads with the record's text (Chroma's `uris` column): columns in
    /// `columnar` (filtered in lockstep too), pointers inside each record otherwise.
    pub scan: Vec<Pointer>,
}

/// An alternative body shape of one route, chosen when `when` resolves in the body (Qdrant's
/// `PUT /points` takes either `{points: [...]}` or `{batch: {...}}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    pub when: Pointer,
    pub shape: Shape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Method {
    Get = 0,
    Post = 1,
    Put = 2,
    Patch = 3,
    Delete = 4,
}

impl Method {
    const COUNT: usize = 5;

    fn parse(s: &str) -> Option<Method> {
        match s {
            "GET" => Some(Method::Get),
            "POST" => Some(Method::Post),
            "PUT" => Some(Method::Put),
            "PATCH" => Some(Method::Patch),
            "DELETE" => Some(Method::Delete),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param(String),
}

/// How to check, after a crash, whether a journaled write reached the upstream: a read route of
/// the same pack, called with placeholders filled in.
#[derive(Debug, Clone, PartialEq)]
struct ReadbackSpec {
    route: String,
    body: Option<serde_json::Value>,
    query: Option<String>,
}

/// One route of a pack, ready for matching and record handling.
#[derive(Debug, Clone)]
pub struct CompiledRoute {
    pub pack: String,
    pub name: String,
    pub kind: RouteKind,
    /// The spec's `ProposedMutation`; `None` only for reads.
    pub mutation: Option<String>,
    /// The spec's `TargetSubstrate` (the route's own or the pack's default).
    pub substrate: String,
    /// Forward this write unevaluated when storage or the kernel is down (default: fail closed).
    pub fail_open: bool,
    /// Whether the gate writes `_integrity` annotations into records of this route.
    pub annotate: bool,
    /// The store merges this route's metadata into the stored record's (Chroma `update` /
    /// `upsert`, Qdrant set-payload): every admitted record is annotated, a plain `allow`
    /// too, so an annotation an earlier write left never outlives the content it described.
    pub merges: bool,
    /// The store ignores this write for an id it already holds (Chroma `add`): a record whose
    /// id the gate has seen stored keeps its trace (the stored content did not change).
    pub keeps_existing: bool,
    pub annotation: AnnotationStyle,
    /// `_integrity` unless the pack says otherwise: the nested key, or the flat prefix.
    pub annotation_key: String,
    /// The pack's `uuid_ids`: the store reads a record id that is a UUID in any spelling as one
    /// record and answers it in canonical form (Qdrant, Weaviate), so the gate keys its trace
    /// by the canonical form too.
    pub uuid_ids: bool,
    /// The pack's `uuid_collections`: the store reads a collection id that is a UUID in any
    /// spelling as one collection (Chroma's collection ids), so the gate keys traces by the
    /// canonical form: otherwise `…/collections/{ID}/get` in upper case would read the records
    /// of the collection past the traces their writes left under the lower-case id.
    pub uuid_collections: bool,
    /// The pack's `capitalized_collections`: the store upper-cases the first letter of a
    /// collection name (Weaviate class names: `article` is class `Article`), so the gate keys
    /// traces by the capitalized name.
    pub capitalized_collections: bool,
    /// The most records one request of this route may carry (the route's `max_records`, else
    /// the pack's): the store's own batch limit. The gate's `limits.proxy_max_records` caps
    /// every route as well; a request over the lower of the two is refused (413) unjudged.
    pub max_records: Option<usize>,
    pub collection: Option<CollectionRef>,
    /// A body member naming the nested path (dot-separated) under which the store writes the
    /// metadata (Qdrant's set-payload `key`). A path into the gate's annotation namespace is
    /// refused: a client may not write the gate's annotations.
    pub metadata_path: Option<Pointer>,
    /// A path parameter that names the record when the body does not (`DELETE /x/{id}`).
    pub id_param: Option<String>,
    /// Delete routes: body members that narrow the named ids (Chroma's `where` and
    /// `where_document` beside `ids`). When one is present, the store deletes only the named
    /// records that match it, so the gate cannot know which went and tombstones none.
    pub conditions: Vec<Pointer>,
    /// The method and path template as written in the pack.
    pub method: &'static str,
    pub template: String,
    pub shape: Shape,
    pub variants: Vec<Variant>,
    /// Where the route was declared, for messages: file, line, and position among the pack's
    /// `[[route]]` tables.
    pub file: String,
    pub line: usize,
    pub index: usize,
    method_id: Method,
    segments: Vec<Segment>,
    readback: Option<ReadbackSpec>,
}

impl CompiledRoute {
    /// The shape that describes `body`: the first variant whose `when` resolves, else the
    /// route's own.
    pub fn shape_for(&self, body: &serde_json::Value) -> &Shape {
        self.variants
            .iter()
            .find(|v| matches!(v.when.get(body), Some(x) if !x.is_null()))
            .map(|v| &v.shape)
            .unwrap_or(&self.shape)
    }

    /// Whether answers of this route need buffering for retrieval treatment at all.
    pub fn treats_response(&self) -> bool {
        self.kind == RouteKind::Read
            && (self.shape.layout != Layout::None
                || self.variants.iter().any(|v| v.shape.layout != Layout::None))
    }

    /// The filter of a delete whose named ids are only candidates (see
    /// [`CompiledRoute::conditions`]): the present, non-empty condition members by pointer.
    pub fn delete_conditions(&self, body: &serde_json::Value) -> Option<serde_json::Value> {
        let present: serde_json::Map<String, serde_json::Value> = self
            .conditions
            .iter()
            .filter_map(|p| {
                let v = p.get(body)?;
                let empty = v.is_null() || v.as_object().is_some_and(|o| o.is_empty());
                (!empty).then(|| (p.as_str().to_string(), v.clone()))
            })
            .collect();
        (!present.is_empty()).then_some(serde_json::Value::Object(present))
    }

    /// Request bodies of this route are NDJSON, not one JSON document.
    pub fn is_ndjson(&self) -> bool {
        self.shape.layout == Layout::Ndjson
    }

    /// Names of the path parameters, in template order.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Param(p) => Some(p.as_str()),
            Segment::Literal(_) => None,
        })
    }
}

/// A compiled pack: every route validated, nothing left to check at request time.
#[derive(Debug, Clone)]
pub struct Pack {
    pub name: String,
    pub description: String,
    /// The file name given to [`compile_pack`], kept for messages.
    pub file: String,
    pub substrate: String,
    pub routes: Vec<CompiledRoute>,
}

/// One problem in a pack, located for a human:
/// `filters/chroma.toml:14: route[2].text: not a JSON pointer (must start with '/')`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", render_pack_error(self))]
pub struct PackError {
    pub file: String,
    pub line: Option<usize>,
    /// Dotted path of the offending value (`route[2].text`); empty for a whole-file problem.
    pub path: String,
    pub message: String,
}

fn render_pack_error(e: &PackError) -> String {
    let mut s = e.file.clone();
    if let Some(line) = e.line {
        s.push(':');
        s.push_str(&line.to_string());
    }
    s.push_str(": ");
    if !e.path.is_empty() {
        s.push_str(&e.path);
        s.push_str(": ");
    }
    s.push_str(&e.message);
    s
}

#[cfg(test)]
mod pack_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_error_display() {
        let e = PackError {
            file: "filters/chroma.toml".into(),
            line: Some(14),
            path: "route[2].text".into(),
            message: "not a JSON pointer (must start with '/')".into(),
        };
        assert_eq!(
            e.to_string(),
            "filters/chroma.toml:14: route[2].text: not a JSON pointer (must start with '/')"
        );
        let e = PackError {
            line: None,
            path: String::new(),
            ..e
        };
        assert_eq!(
            e.to_string(),
            "filters/chroma.toml: not a JSON pointer (must start with '/')"
        );
    }

    #[test]
    fn table_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<RouteTable>();
        check::<Pack>();
    }
}
