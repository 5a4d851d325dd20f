#!/usr/bin/env python3
"""Harvests benign text of many genres and languages from what a Debian machine with this
project's toolchain has installed, for the detector's benign training and held-out sets.

Sources (each record names its own): manual pages in English and 20 other languages (rendered
by man(1)), /usr/share/doc READMEs and licence texts, Debian package descriptions, AppStream
descriptions in every language they are translated to, gettext message catalogues, the Python
reference (pydoc topics), Python and Rust docstrings, source code and READMEs of the installed
crates and Python packages, and AWS API documentation strings (botocore).

The split is by source group (a package, crate or manual page name), never by line: a group's
paragraphs all go to train or all to held-out. The output is committed, so training reads the
same bytes on every machine; this script is how it was made:

    python3 scripts/detector/harvest_benign.py tests/detector_corpus

Needs: man, groff, lz4, PyYAML, and the manpages-XX packages for the other languages.
"""
import ast
import glob
import gzip
import hashlib
import html
import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

RNG = random.Random(20261127)
MIN_CHARS, MAX_CHARS = 40, 2400
HELDOUT_SHARE = 10  # one source group in ten is held out
# At most this many training records per genre (a seeded sample), so that no genre dominates
# and the committed file stays small; the held-out share is kept whole.
TRAIN_CAPS = {"ui_strings": 6000, "how_to": 16000, "api_docs": 16000, "web_page": 10000,
              "legal": 3000, "code": 5000}

seen = set()
records = []  # (group, record)


def clean(t):
    t = t.replace("\r", "")
    t = re.sub(r"[ \t]+", " ", t)
    t = re.sub(r"\n{3,}", "\n\n", t)
    return t.strip()


def letters_ok(t):
    letters = sum(c.isalpha() for c in t)
    return letters >= 0.5 * len(t) and len(t.split()) >= 5 if " " in t else letters >= 20


def add(group, text, genre, lang, source):
    text = clean(text)
    if not (MIN_CHARS <= len(text) <= MAX_CHARS):
        return
    if not letters_ok(text):
        return
    key = hashlib.sha256(re.sub(r"\W+", " ", text.lower()).encode()).digest()[:12]
    if key in seen:
        return
    seen.add(key)
    records.append((group, {"text": text, "genre": genre, "lang": lang, "source": source}))


def paragraphs(text):
    for p in re.split(r"\n\s*\n", text):
        p = p.strip()
        if p:
            yield p


def chunk_paragraphs(paras, limit=1400):
    """Joins consecutive short paragraphs into documents of up to `limit` characters."""
    buf = []
    size = 0
    for p in paras:
        if size and size + len(p) > limit:
            yield "\n\n".join(buf)
            buf, size = [], 0
        buf.append(p)
        size += len(p) + 2
    if buf:
        yield "\n\n".join(buf)


# ---------------------------------------------------------------------------------------------
# manual pages

MAN_LANGS = {
    "": "en", "de": "de", "fr": "fr", "es": "es", "it": "it", "pl": "pl", "ru": "ru", "nl": "nl",
    "pt_BR": "pt", "ja": "ja", "zh_CN": "zh", "uk": "uk", "cs": "cs", "sv": "sv", "fi": "fi",
    "ro": "ro", "vi": "vi", "el": "el", "id": "id", "tr": "tr", "ko": "ko", "hu": "hu", "da": "da",
}


def render_man(path):
    env = dict(os.environ, MANWIDTH="4000", LC_ALL="C.UTF-8", MAN_KEEP_FORMATTING="0")
    try:
        out = subprocess.run(["man", "-l", "-E", "UTF-8", path], capture_output=True,
                             env=env, timeout=20).stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return ""
    return re.sub(r".\x08", "", out)


def harvest_man(per_lang_en=1600, per_lang=260):
    jobs = []
    for sub, lang in MAN_LANGS.items():
        base = os.path.join("/usr/share/man", sub) if sub else "/usr/share/man"
        files = sorted(glob.glob(os.path.join(base, "man[1-8]", "*")))
        RNG.shuffle(files)
        files = files[: per_lang_en if lang == "en" else per_lang]
        jobs += [(f, lang) for f in files]

    def one(job):
        f, lang = job
        return f, lang, render_man(f)

    with ThreadPoolExecutor(max_workers=4) as ex:
        for f, lang, out in ex.map(one, jobs):
            name = os.path.basename(f).split(".")[0]
            lines = [l.strip() for l in out.splitlines()]
            # A rendered page has one paragraph per line at this width; headings are short.
            paras = [l for l in lines if len(l) >= MIN_CHARS]
            for doc in chunk_paragraphs(paras, 900):
                add("man:" + name, doc, "how_to", lang, f)


# ---------------------------------------------------------------------------------------------
# /usr/share/doc

def harvest_share_doc():
    for d in sorted(glob.glob("/usr/share/doc/*")):
        pkg = os.path.basename(d)
        for f in sorted(glob.glob(d + "/**/*", recursive=True)):
            base = os.path.basename(f).lower()
            if not os.path.isfile(f) or os.path.getsize(f) > 400_000:
                continue
            if "changelog" in base or base.endswith((".html", ".htm", ".png", ".svg", ".pdf")):
                continue
            genre = "legal" if base == "copyright" else "api_docs"
            if not (base == "copyright" or base.startswith("readme") or base.endswith((".md", ".txt", ".md.gz", ".txt.gz", ".rst", ".rst.gz")) or base in ("news", "news.gz", "todo", "faq", "faq.gz")):
                continue
            try:
                raw = gzip.open(f).read() if f.endswith(".gz") else open(f, "rb").read()
                text = raw.decode("utf-8")
            except Exception:
                continue
            if base == "copyright":
                # The licence body: skip the machine-readable headers.
                text = "\n".join(l for l in text.splitlines() if not re.match(r"^(Files|Copyright|Upstream-\w+|Source|Format|Comment|License):", l))
                text = text.replace("\n .\n", "\n\n").replace("\n ", "\n")
            for doc in chunk_paragraphs(paragraphs(text), 1400):
                add("doc:" + pkg, doc, genre, "en", f)


# ---------------------------------------------------------------------------------------------
# Debian package descriptions and AppStream (many languages)

def harvest_debian_descriptions(limit=9000):
    lists = sorted(glob.glob("/var/lib/apt/lists/*_Packages.lz4"))
    descs = {}
    for l in lists:
        out = subprocess.run(["lz4", "-dc", l], capture_output=True).stdout.decode("utf-8", "replace")
        for stanza in out.split("\n\n"):
            m = re.search(r"^Package: (.+)$", stanza, re.M)
            d = re.search(r"^Description: (.*(?:\n .*)*)", stanza, re.M)
            if m and d:
                body = d.group(1).replace("\n .\n", "\n\n").replace("\n ", "\n")
                descs[m.group(1)] = body
    names = sorted(descs)
    RNG.shuffle(names)
    for n in names[:limit]:
        add("deb:" + n.split("-")[0], descs[n], "web_page", "en", "Packages:" + n)


def harvest_appstream(limit_per_lang=700):
    import yaml
    path = "/var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_main_dep11_Components-amd64.yml.gz"
    if not os.path.exists(path):
        return
    per_lang = {}
    for doc in yaml.safe_load_all(gzip.open(path)):
        if not isinstance(doc, dict) or "Description" not in doc:
            continue
        pkg = doc.get("Package", "?")
        for lang, body in (doc.get("Description") or {}).items():
            if not isinstance(body, str):
                continue
            lang2 = "en" if lang in ("C", "en_GB", "en_US") else lang.split("_")[0].split("@")[0]
            text = re.sub(r"</?(p|ul|ol)>", "\n\n", body)
            text = re.sub(r"<li>", "\n- ", text)
            text = html.unescape(re.sub(r"<[^>]+>", "", text))
            per_lang.setdefault(lang2, []).append((pkg, text))
    for lang2, items in sorted(per_lang.items()):
        RNG.shuffle(items)
        for pkg, text in items[:limit_per_lang]:
            add("deb:" + pkg.split("-")[0], text, "web_page", lang2, "appstream:" + pkg)


def harvest_gettext(per_lang=500):
    import gettext
    by_lang = {}
    for f in sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo")):
        lang = f.split("/")[4].split("_")[0].split("@")[0]
        domain = os.path.basename(f)[:-3]
        try:
            cat = gettext.GNUTranslations(open(f, "rb"))._catalog
        except Exception:
            continue
        for k, v in cat.items():
            if isinstance(k, str) and isinstance(v, str) and k and len(v) >= 60 and v != k:
                by_lang.setdefault(lang, []).append((domain, v))
    for lang, items in sorted(by_lang.items()):
        if lang == "en":
            continue
        RNG.shuffle(items)
        for domain, v in items[:per_lang]:
            add("mo:" + domain, v.replace("%s", "X").replace("%d", "3"), "ui_strings", lang, "gettext:" + domain)


# ---------------------------------------------------------------------------------------------
# Python: reference, docstrings, code, botocore API docs

def harvest_python(site, max_files=2500):
    try:
        import pydoc_data.topics as t
        for name, body in sorted(t.topics.items()):
            for doc in chunk_paragraphs(paragraphs(body), 1400):
                add("pydoc:" + name, doc, "api_docs", "en", "pydoc_data:" + name)
    except Exception:
        pass
    files = sorted(glob.glob(site + "/**/*.py", recursive=True))
    RNG.shuffle(files)
    for f in files[:max_files]:
        pkg = os.path.relpath(f, site).split(os.sep)[0]
        try:
            src = open(f, encoding="utf-8").read()
            tree = ast.parse(src)
        except Exception:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                d = ast.get_docstring(node)
                if d:
                    for doc in chunk_paragraphs(paragraphs(d), 1200):
                        add("py:" + pkg, doc, "api_docs", "en", f)
        lines = src.splitlines()
        if len(lines) > 30:
            start = RNG.randrange(0, len(lines) - 25)
            add("py:" + pkg, "\n".join(lines[start:start + RNG.randrange(8, 30)]), "code", "en", f)
    for f in sorted(glob.glob(site + "/botocore/data/*/*/service-2.json*"))[:400]:
        svc = f.split("/")[-3]
        try:
            raw = gzip.open(f).read() if f.endswith(".gz") else open(f, "rb").read()
            data = json.loads(raw)
        except Exception:
            continue
        docs = []

        def walk(o):
            if isinstance(o, dict):
                for k, v in o.items():
                    if k == "documentation" and isinstance(v, str):
                        docs.append(v)
                    else:
                        walk(v)
            elif isinstance(o, list):
                for v in o:
                    walk(v)
        walk(data)
        RNG.shuffle(docs)
        for d in docs[:25]:
            text = html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"</p>\s*<p>", "\n\n", d)))
            add("aws:" + svc, text, "api_docs", "en", f)
    for f in sorted(glob.glob(site + "/**/*.md", recursive=True) + glob.glob(site + "/**/*.rst", recursive=True) + glob.glob(site + "/*.dist-info/METADATA")):
        pkg = os.path.relpath(f, site).split(os.sep)[0].split("-")[0]
        try:
            text = open(f, encoding="utf-8").read()
        except Exception:
            continue
        if f.endswith("METADATA"):
            text = text.split("\n\n", 1)[-1]
        for doc in chunk_paragraphs(paragraphs(text), 1400):
            add("py:" + pkg, doc, "api_docs", "en", f)


# ---------------------------------------------------------------------------------------------
# Rust crates: READMEs, doc comments, code

def harvest_crates(root):
    crates = sorted(glob.glob(root + "/*/*/"))
    for c in crates:
        name = re.sub(r"-\d+\.\d+.*$", "", os.path.basename(c.rstrip("/")))
        for f in sorted(glob.glob(c + "README*") + glob.glob(c + "*.md")):
            try:
                text = open(f, encoding="utf-8").read()
            except Exception:
                continue
            for doc in chunk_paragraphs(paragraphs(text), 1400):
                add("crate:" + name, doc, "api_docs", "en", f)
        srcs = sorted(glob.glob(c + "src/**/*.rs", recursive=True))
        RNG.shuffle(srcs)
        for f in srcs[:6]:
            try:
                lines = open(f, encoding="utf-8").read().splitlines()
            except Exception:
                continue
            doc, block = [], []
            for l in lines:
                s = l.strip()
                if s.startswith(("///", "//!")):
                    block.append(s[3:].strip())
                elif block:
                    doc.append(" ".join(block))
                    block = []
            for d in doc[:12]:
                add("crate:" + name, d, "api_docs", "en", f)
            if len(lines) > 40:
                start = RNG.randrange(0, len(lines) - 30)
                add("crate:" + name, "\n".join(lines[start:start + RNG.randrange(10, 35)]), "code", "en", f)


def capped(recs):
    by_genre = {}
    for r in sorted(recs, key=lambda r: (r["source"], r["text"])):
        by_genre.setdefault(r["genre"], []).append(r)
    rng = random.Random(7)
    out = []
    for genre, rs in sorted(by_genre.items()):
        rng.shuffle(rs)
        out += rs[: TRAIN_CAPS.get(genre, 5000)]
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/detector_corpus"
    site = [p for p in __import__("site").getsitepackages() if os.path.isdir(p)][0]
    crates = os.path.expanduser("~/.cargo/registry/src")
    steps = [
        ("man", harvest_man), ("share-doc", harvest_share_doc),
        ("debian", harvest_debian_descriptions), ("appstream", harvest_appstream),
        ("gettext", harvest_gettext), ("python", lambda: harvest_python(site)),
        ("crates", lambda: harvest_crates(crates)),
    ]
    for name, fn in steps:
        before = len(records)
        fn()
        print(f"{name}: {len(records) - before} records", file=sys.stderr)
    train, held = [], []
    for group, rec in records:
        h = int(hashlib.sha256(group.encode()).hexdigest(), 16)
        (held if h % HELDOUT_SHARE == 0 else train).append(rec)
    train = capped(train)
    for role, recs in (("train", train), ("heldout", held)):
        path = os.path.join(out_dir, role, "benign_harvest.jsonl.gz")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        recs.sort(key=lambda r: (r["source"], r["text"]))
        with gzip.GzipFile(path, "wb", mtime=0) as g:
            for r in recs:
                g.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
        langs = {}
        for r in recs:
            langs[r["lang"]] = langs.get(r["lang"], 0) + 1
        print(f"{path}: {len(recs)} records, {len(langs)} languages", file=sys.stderr)


if __name__ == "__main__":
    main()
