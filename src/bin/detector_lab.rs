//! `detector-lab`: the training and evaluation side of the learned injection detector, driven
//! by `scripts/detector/build.sh`. It shares the kernel's code, so what is trained and measured
//! is what the gate runs:
//!
//! - `featurize` turns documents into the windows and hashed features the kernel scores, in
//!   files the trainer reads as a sparse matrix;
//! - `score` runs every record through the rules alone, the model alone and the whole kernel
//!   (a low-trust source writing into a RAG store, as the sidecar's default source does).

use clap::{Parser, Subcommand};
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use substrate_gate::config::PolicyConfig;
use substrate_gate::kernel::detectors::{reading_text, ScanContext};
use substrate_gate::kernel::learned::{self, FeatureSpec, Model};
use substrate_gate::kernel::policy::CompiledPolicy;
use substrate_gate::kernel::types::{
    AllowedInfluence, EvaluationMode, EvaluationProfile, FreeForm, ProductSurface,
    ProposedMutation, SourceType, TargetSubstrate,
};
use substrate_gate::kernel::{evaluate, KernelInput, NormalizedSignal, StateBasis};
use uuid::Uuid;

#[derive(Parser)]
#[command(
    name = "detector-lab",
    about = "Featurize and score corpora for the learned injection detector"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Documents (JSON Lines: `parts`, a list of `{"t": text, "inj": bool}` read in order, each
    /// normalized as the kernel normalizes a payload) to windows: PREFIX.indptr (u64), PREFIX.indices (u32), PREFIX.values (f32), PREFIX.rows
    /// (u32 document, u8 label: 0 clean, 1 injected, 2 partly; u8 pair; u16 zero).
    Featurize {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = FeatureSpec::DEFAULT.bits)]
        bits: u32,
        #[arg(long, default_value_t = FeatureSpec::DEFAULT.char_min)]
        char_min: u32,
        #[arg(long, default_value_t = FeatureSpec::DEFAULT.char_max)]
        char_max: u32,
        #[arg(long, default_value_t = FeatureSpec::DEFAULT.word_max)]
        word_max: u32,
        /// Keep at most this many clean windows per document (0: all), chosen by a fixed seed.
        #[arg(long, default_value_t = 0)]
        clean_windows_per_doc: usize,
    },
    /// Records (JSON Lines: `text`, optional `metadata` object) to one JSON line each: the
    /// model's best window and probability, the kernel's decision with rules alone and with
    /// rules and model.
    Score {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// A model file other than the built-in one.
        #[arg(long)]
        model: Option<PathBuf>,
        /// Hold threshold (default: the model file's own).
        #[arg(long)]
        hold: Option<f64>,
        /// Warning threshold (default: the model file's own).
        #[arg(long)]
        warn: Option<f64>,
        #[arg(long, default_value = "retrieved_document")]
        source_type: String,
        #[arg(long, default_value_t = 0.2)]
        trust: f64,
        #[arg(long, default_value = "rag_store")]
        substrate: String,
    },
    /// Records to the indices of the built-in rules each one matches (the learned detector
    /// off), after a first line naming every rule: what each rule adds, and what it costs.
    Rules {
        #[arg(long)]
        input: PathBuf,
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Featurize {
            input,
            out,
            bits,
            char_min,
            char_max,
            word_max,
            clean_windows_per_doc,
        } => featurize(
            &input,
            &out,
            FeatureSpec {
                bits,
                char_min,
                char_max,
                word_max,
            },
            clean_windows_per_doc,
        ),
        Command::Score {
            input,
            out,
            model,
            hold,
            warn,
            source_type,
            trust,
            substrate,
        } => score(
            &input,
            &out,
            model.as_deref(),
            hold,
            warn,
            &source_type,
            trust,
            &substrate,
        ),
        Command::Rules { input, out } => rules(&input, &out),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("detector-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Deserialize)]
struct Doc {
    parts: Vec<Part>,
}

#[derive(Deserialize)]
struct Part {
    t: String,
    #[serde(default)]
    inj: bool,
}

impl Doc {
    /// The text as the kernel reads it, and the byte ranges of its injected parts.
    fn reading(&self) -> (String, Vec<(usize, usize)>) {
        let mut text = String::new();
        let mut spans = Vec::new();
        for p in &self.parts {
            let start = text.len();
            text.push_str(&reading_text(&p.t));
            if p.inj {
                spans.push((start, text.len()));
            }
        }
        (text, spans)
    }
}

fn writer(prefix: &Path, ext: &str) -> Result<BufWriter<File>, String> {
    let path = prefix.with_extension(ext);
    File::create(&path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn lines(input: &Path) -> Result<impl Iterator<Item = (usize, String)>, String> {
    let f = File::open(input).map_err(|e| format!("{}: {e}", input.display()))?;
    Ok(BufReader::new(f)
        .lines()
        .map_while(Result::ok)
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty()))
}

fn featurize(input: &Path, out: &Path, spec: FeatureSpec, keep_clean: usize) -> Result<(), String> {
    let spec = spec.validate().map_err(|e| e.to_string())?;
    let (mut indptr, mut indices, mut values, mut rows) = (
        writer(out, "indptr")?,
        writer(out, "indices")?,
        writer(out, "values")?,
        writer(out, "rows")?,
    );
    let io = |e: std::io::Error| e.to_string();
    let mut nnz: u64 = 0;
    indptr.write_all(&nnz.to_le_bytes()).map_err(io)?;
    let (mut docs, mut windows) = (0u64, 0u64);
    for (lineno, line) in lines(input)? {
        let doc: Doc =
            serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", lineno + 1))?;
        let (text, spans) = doc.reading();
        let mut all: Vec<(u8, bool, u32, Vec<(u32, i32)>)> = Vec::new();
        learned::for_each_window(spec, &text, |w| {
            let label = label_of(w.start, w.end, &spans);
            all.push((label, w.pair, w.ngrams, w.entries.to_vec()));
        });
        // The clean windows kept: a fixed pseudo-random choice per document.
        let mut clean: Vec<usize> = (0..all.len()).filter(|&i| all[i].0 == 0).collect();
        if keep_clean > 0 && clean.len() > keep_clean {
            let mut state = (docs + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for i in (1..clean.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                clean.swap(i, (state % (i as u64 + 1)) as usize);
            }
            clean.truncate(keep_clean);
        }
        let keep: std::collections::HashSet<usize> = clean.into_iter().collect();
        for (i, (label, pair, n, entries)) in all.iter().enumerate() {
            if *label == 0 && !keep.contains(&i) {
                continue;
            }
            let norm = 1.0 / f64::from(*n).sqrt();
            for &(b, c) in entries {
                indices.write_all(&b.to_le_bytes()).map_err(io)?;
                values
                    .write_all(&((f64::from(c) * norm) as f32).to_le_bytes())
                    .map_err(io)?;
            }
            nnz += entries.len() as u64;
            indptr.write_all(&nnz.to_le_bytes()).map_err(io)?;
            let doc_id = u32::try_from(lineno).map_err(|_| "too many documents")?;
            rows.write_all(&doc_id.to_le_bytes()).map_err(io)?;
            rows.write_all(&[*label, u8::from(*pair), 0, 0])
                .map_err(io)?;
            windows += 1;
        }
        docs += 1;
    }
    for w in [&mut indptr, &mut indices, &mut values, &mut rows] {
        w.flush().map_err(io)?;
    }
    eprintln!("featurize: {docs} documents, {windows} windows, {nnz} entries");
    Ok(())
}

/// 1 when the window is mostly injected text (or holds most of an injection), 2 when it only
/// touches one, 0 when it is clean.
fn label_of(start: usize, end: usize, spans: &[(usize, usize)]) -> u8 {
    let mut label = 0;
    for &(s, e) in spans {
        let overlap = end.min(e).saturating_sub(start.max(s));
        if overlap == 0 {
            continue;
        }
        let shorter = (end - start).min(e.saturating_sub(s)).max(1);
        if overlap * 2 >= shorter {
            return 1;
        }
        label = 2;
    }
    label
}

#[derive(Deserialize)]
struct Record {
    text: String,
    #[serde(default)]
    metadata: FreeForm,
}

#[allow(clippy::too_many_arguments)]
fn score(
    input: &Path,
    out: &Path,
    model_path: Option<&Path>,
    hold: Option<f64>,
    warn: Option<f64>,
    source_type: &str,
    trust: f64,
    substrate: &str,
) -> Result<(), String> {
    let model = match model_path {
        Some(p) => {
            let bytes = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            Some(Arc::new(
                Model::from_bytes(&bytes).map_err(|e| e.to_string())?,
            ))
        }
        None => Model::builtin(),
    };
    // Unless told otherwise, the thresholds the model file was calibrated with.
    let mut cfg = PolicyConfig::default();
    if let Some(m) = &model {
        cfg.detectors.model.hold_threshold = hold.unwrap_or(m.default_hold());
        cfg.detectors.model.warn_threshold = warn.unwrap_or(m.default_warn());
    }
    let both = CompiledPolicy::compile_with_model("both", &cfg, model.clone())?;
    let mut rules_cfg = cfg.clone();
    rules_cfg.detectors.model.enabled = false;
    let rules = CompiledPolicy::compile_with_model("rules", &rules_cfg, None)?;
    let source_type = SourceType::parse(source_type).ok_or("unknown --source-type")?;
    let substrate = TargetSubstrate::parse(substrate).ok_or("unknown --substrate")?;

    let mut w = writer(out, "jsonl")?;
    for (lineno, line) in lines(input)? {
        let rec: Record =
            serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", lineno + 1))?;
        let input = kernel_input(&rec, lineno, source_type, trust, substrate);
        let meta_text = (!rec.metadata.is_empty())
            .then(|| serde_json::to_string(&rec.metadata).unwrap_or_default());
        let ctx = ScanContext {
            source_trust: trust,
            metadata_text: meta_text.as_deref(),
            metadata: Some(&rec.metadata),
            ..ScanContext::new(source_type.as_str())
        };
        let reading = both.detectors.model_reading(&rec.text, &ctx);
        let exact = rules.detectors.exact_phrase_matches(&rec.text, &ctx);
        let r = evaluate(&input, &rules);
        let b = evaluate(&input, &both);
        let line = json!({
            "i": lineno,
            "p": reading.as_ref().map(|m| m.probability),
            "logit": reading.as_ref().map(|m| m.logit),
            "place": reading.as_ref().map(|m| m.place),
            "window": reading.as_ref().map(|m| [m.start_char, m.end_char]),
            "rules": r.decision,
            "rules_codes": r.reason_codes,
            "exact": exact,
            "both": b.decision,
            "codes": b.reason_codes,
        });
        serde_json::to_writer(&mut w, &line).map_err(|e| e.to_string())?;
        w.write_all(b"\n").map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())?;
    Ok(())
}

fn kernel_input(
    rec: &Record,
    lineno: usize,
    source_type: SourceType,
    trust: f64,
    substrate: TargetSubstrate,
) -> KernelInput {
    let ns = Uuid::from_u128(0x6a0e_6d8c_52b4_4a55_9d1c_3e7f_0b1a_2c3d);
    let id = Uuid::new_v5(&ns, format!("record:{lineno}").as_bytes());
    let trace_id = Uuid::new_v5(&ns, format!("trace:{lineno}").as_bytes());
    KernelInput {
        signal: NormalizedSignal {
            id,
            tenant_id: Uuid::from_u128(1),
            product_surface: ProductSurface::Generic,
            source_type,
            source_id: "detector-lab".into(),
            source_trust_level: trust,
            source_authority_level: 0.0,
            authority_ceiling_applied: false,
            target_substrate: substrate,
            target_region_id: None,
            trace_id,
            proposed_mutation: ProposedMutation::CreateTrace,
            event_type: None,
            payload: rec.text.clone(),
            payload_digest: hex::encode(Sha256::digest(rec.text.as_bytes())),
            payload_summary: None,
            raw_payload_ref: None,
            authority_claim: None,
            evidence_refs: vec![],
            observed_at: None,
            metadata: rec.metadata.clone(),
        },
        profile: EvaluationProfile::Standard,
        mode: EvaluationMode::Enforcement,
        equation_bundles: vec![],
        basis: StateBasis {
            trace_id,
            phase: None,
            influence: AllowedInfluence::None,
            source_recent: 0,
            source_refused: 0,
        },
    }
}

/// Per record, the indices of the rules that match it (model off), after a first line naming
/// every rule.
fn rules(input: &Path, out: &Path) -> Result<(), String> {
    let mut cfg = PolicyConfig::default();
    cfg.detectors.model.enabled = false;
    let policy = CompiledPolicy::compile_with_model("rules", &cfg, None)?;
    let d = &policy.detectors;
    let mut w = writer(out, "jsonl")?;
    let names: Vec<String> = (0..128).map_while(|i| d.rule_name(i)).collect();
    serde_json::to_writer(&mut w, &json!({ "rules": names })).map_err(|e| e.to_string())?;
    w.write_all(b"\n").map_err(|e| e.to_string())?;
    for (lineno, line) in lines(input)? {
        let rec: Record =
            serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", lineno + 1))?;
        let meta_text = (!rec.metadata.is_empty())
            .then(|| serde_json::to_string(&rec.metadata).unwrap_or_default());
        let ctx = ScanContext {
            source_trust: 0.2,
            metadata_text: meta_text.as_deref(),
            metadata: Some(&rec.metadata),
            ..ScanContext::new("retrieved_document")
        };
        let bits = d.rules_matching(&rec.text, &ctx);
        let fired: Vec<u32> = (0..128).filter(|i| bits >> i & 1 == 1).collect();
        serde_json::to_writer(&mut w, &json!(fired)).map_err(|e| e.to_string())?;
        w.write_all(b"\n").map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
}
