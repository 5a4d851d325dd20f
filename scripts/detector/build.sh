#!/usr/bin/env bash
# One command from tests/detector_corpus to models/injection.sgim (with its golden scores,
# models/injection.golden.jsonl) and docs/detector-report.md:
#
#   bash scripts/detector/build.sh
#
# compose (seeded) -> featurize (the kernel's own code) -> five fold models, scored out of fold
# -> thresholds from those scores (training data only) -> the model on all training data ->
# the held-out sets scored through the whole kernel -> the report. CPU only; same corpus, same
# bytes. WORKDIR (default target/detector) holds the intermediate files.
set -euo pipefail
cd "$(dirname "$0")/../.."
W="${WORKDIR:-target/detector}"
mkdir -p "$W"
python3 -m pip install -q --disable-pip-version-check -r scripts/detector/requirements.txt
cargo build --release --locked --bin detector-lab
LAB="${CARGO_TARGET_DIR:-target}/release/detector-lab"

python3 scripts/detector/compose.py "$W"
"$LAB" featurize --input "$W/train_docs.jsonl" --out "$W/train" --clean-windows-per-doc 8 2> "$W/featurize.log"
cat "$W/featurize.log"
python3 scripts/detector/evaluate.py split "$W"
for f in 0 1 2 3 4; do
  python3 scripts/detector/train.py "$W" --out "$W/fold$f.sgim" --exclude-fold "$f"
  "$LAB" score --model "$W/fold$f.sgim" --input "$W/oof_$f.jsonl" --out "$W/oof_scores_$f"
done
python3 scripts/detector/evaluate.py calibrate "$W"
read -r HOLD WARN A B < <(python3 -c "import json; t=json.load(open('$W/thresholds.json')); print(t['hold'], t['warn'], t['a'], t['b'])")
python3 scripts/detector/train.py "$W" --out models/injection.sgim --hold "$HOLD" --warn "$WARN" --calibration "$A" "$B"
"$LAB" score --model models/injection.sgim --input "$W/heldout_records.jsonl" --out "$W/heldout_scores"
python3 scripts/detector/evaluate.py golden-texts "$W"
"$LAB" score --model models/injection.sgim --input "$W/golden_records.jsonl" --out "$W/golden_scores"
python3 scripts/detector/evaluate.py golden "$W" models/injection.golden.jsonl
python3 scripts/detector/evaluate.py info "$W" models/injection.sgim
python3 scripts/detector/evaluate.py report "$W" docs/detector-report.md "bash scripts/detector/build.sh"
sha256sum models/injection.sgim
