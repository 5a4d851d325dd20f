//! Directive claims ("refunds must be approved by a manager") and whether
//! two of them contradict. Deliberately simple and predictable: a claim is
//! a sentence with a modal or directive word; its subject is the set of its
//! content words; its polarity is the parity of its negations. Two claims
//! contradict when their subjects (nearly) coincide and their polarities differ.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// Content words, stemmed, sorted.
    pub subject: Vec<String>,
    pub negative: bool,
    /// The sentence (first 200 characters), for explanations.
    pub text: String,
}

const MODALS: &[&str] = &[
    "must",
    "shall",
    "should",
    "always",
    "never",
    "may",
    "can",
    "cannot",
    "required",
    "require",
    "requires",
    "forbidden",
    "prohibited",
    "allowed",
    "permitted",
    "mustn't",
    "shouldn't",
    "can't",
    "don't",
    "do",
];

const NEGATIONS: &[&str] = &[
    "not",
    "never",
    "no",
    "cannot",
    "can't",
    "don't",
    "mustn't",
    "shouldn't",
    "without",
    "forbidden",
    "prohibited",
    "disallowed",
];

const STOP: &[&str] = &[
    "a",
    "an",
    "the",
    "and",
    "or",
    "of",
    "to",
    "in",
    "on",
    "for",
    "by",
    "with",
    "at",
    "from",
    "be",
    "is",
    "are",
    "was",
    "were",
    "been",
    "being",
    "it",
    "its",
    "this",
    "that",
    "these",
    "those",
    "all",
    "any",
    "every",
    "each",
    "as",
    "into",
    "than",
    "then",
    "only",
    "also",
    "up",
    "our",
    "their",
    "your",
    "we",
    "they",
    "you",
    "he",
    "she",
    "i",
    "will",
    "would",
    "does",
    "did",
    "has",
    "have",
    "had",
    "so",
    "such",
    "effective",
    "immediately",
    "please",
];

fn words(sentence: &str) -> Vec<String> {
    sentence
        .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '$' || c == '%'))
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase().replace('\u{2019}', "'"))
        .collect()
}

fn stem(w: &str) -> String {
    if w.len() > 3 && w.ends_with('s') && !w.ends_with("ss") {
        w[..w.len() - 1].to_string()
    } else {
        w.to_string()
    }
}

/// Directive claims of a text, at most 32.
pub fn extract(text: &str) -> Vec<Claim> {
    let mut out = Vec::new();
    for sentence in text.split(['.', '!', '?', ';', '\n']) {
        let ws = words(sentence);
        let directive = ws.iter().any(|w| MODALS.contains(&w.as_str()));
        // "do" alone is not directive; "do not" is.
        let directive = directive
            && (ws.iter().any(|w| w != "do" && MODALS.contains(&w.as_str()))
                || ws.windows(2).any(|p| p[0] == "do" && p[1] == "not"));
        if !directive {
            continue;
        }
        let negations = ws
            .iter()
            .filter(|w| NEGATIONS.contains(&w.as_str()))
            .count();
        let subject: BTreeSet<String> = ws
            .iter()
            .filter(|w| {
                !MODALS.contains(&w.as_str())
                    && !NEGATIONS.contains(&w.as_str())
                    && !STOP.contains(&w.as_str())
                    && w.chars().count() >= 2
            })
            .map(|w| stem(w))
            .collect();
        if subject.len() < 2 {
            continue;
        }
        out.push(Claim {
            subject: subject.into_iter().collect(),
            negative: negations % 2 == 1,
            text: sentence.trim().chars().take(200).collect(),
        });
        if out.len() == 32 {
            break;
        }
    }
    out
}

/// Jaccard similarity of two subjects.
fn overlap(a: &[String], b: &[String]) -> f64 {
    let a: BTreeSet<&String> = a.iter().collect();
    let b: BTreeSet<&String> = b.iter().collect();
    let inter = a.intersection(&b).count() as f64;
    let union = a.union(&b).count() as f64;
    if union == 0.0 {
        0.0
    } else {
        inter / union
    }
}

pub fn contradicts(a: &Claim, b: &Claim) -> bool {
    a.negative != b.negative && overlap(&a.subject, &b.subject) >= 0.75
}

/// The first contradicting pair between two claim sets.
pub fn first_contradiction<'a>(a: &'a [Claim], b: &'a [Claim]) -> Option<(&'a Claim, &'a Claim)> {
    a.iter()
        .flat_map(|x| b.iter().map(move |y| (x, y)))
        .find(|(x, y)| contradicts(x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opposite_directives_on_the_same_subject_contradict() {
        let a = extract("Refunds must be approved by a manager.");
        let b = extract("Refunds must not be approved by a manager.");
        assert_eq!(a.len(), 1);
        assert!(!a[0].negative && b[0].negative);
        assert!(first_contradiction(&a, &b).is_some());
    }

    #[test]
    fn without_counts_as_a_negation() {
        let a = extract("Agents must approve refunds up to $5,000 without review");
        let b = extract("Agents must approve refunds up to $5,000 with review");
        assert!(first_contradiction(&a, &b).is_some());
    }

    #[test]
    fn different_subjects_or_same_polarity_do_not() {
        let a = extract("Refunds must be approved by a manager.");
        let c = extract("Invoices must not be paid before delivery.");
        let d = extract("A manager must approve refunds.");
        assert!(first_contradiction(&a, &c).is_none());
        assert!(first_contradiction(&a, &d).is_none());
    }

    #[test]
    fn plain_statements_are_not_claims() {
        assert!(extract("The sky is blue. Paris is in France.").is_empty());
        assert!(extract("We do the work.").is_empty());
        assert_eq!(extract("Do not share passwords with vendors").len(), 1);
    }
}
