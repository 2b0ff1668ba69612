#!/usr/bin/env python3
"""Reads one recording's srt and vtt documents with real clients and checks the cue limits.

Clients: PyPI's `srt` and `webvtt-py` (scripts/ci-requirements.txt) and ffmpeg, which must
convert each document to ASS with one Dialogue event per cue, at the cue's times. Checks:

- every cue lasts at most --max-cue-s and has 1 to --max-lines lines of at most
  --max-line-chars characters (srt: the `[speaker_N] ` label counts); only a line that is a
  single word may be longer;
- cues are in order and lie within [0, duration] (the verbose_json's duration);
- the cues carry the verbose_json's words, in order, each once;
- verbose_json: the official `openai` package's `TranscriptionVerbose` model validates it;
  every segment and word lies within [0, duration] with start <= end; each segment's
  compression_ratio is Python's len(b) / len(zlib.compress(b)), its temperature 0, its
  avg_logprob a finite mean log-probability (<= 0, and >= -ln(classes) when --classes is given:
  a greedy decoder's tokens are each the most probable label) and its no_speech_prob in [0, 1].

Usage: subtitle_clients.py [--max-cue-s S] [--max-line-chars N] [--max-lines N]
           [--classes N] --verbose-json FILE.json FILE.srt|FILE.vtt...
Exit 0 when every check passes, 1 with one line per failure.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import pydantic
import srt
import webvtt
from openai.types.audio import TranscriptionVerbose

SRT_LABEL = re.compile(r"^\[speaker_\d+\] ")


@dataclass
class Cue:
    start_ms: int
    end_ms: int
    lines: list[str]  # as shown, the srt label included
    label: str  # the srt speaker label, "" when none


def srt_cues(path: Path) -> list[Cue]:
    cues = []
    for sub in srt.parse(path.read_text(encoding="utf-8")):
        lines = sub.content.split("\n")
        label = m.group(0) if (m := SRT_LABEL.match(lines[0])) else ""
        cues.append(Cue(ms(sub.start.total_seconds()), ms(sub.end.total_seconds()), lines, label))
    return cues


def vtt_cues(path: Path) -> list[Cue]:
    return [
        Cue(c.start_time.in_milliseconds(), c.end_time.in_milliseconds(),
            [html.unescape(line) for line in c.text.split("\n")], "")
        for c in webvtt.read(str(path))
    ]


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def ass_clock_ms(clock: str) -> int:
    h, m, s = clock.split(":")
    return round((int(h) * 3600 + int(m) * 60 + float(s)) * 1000)


def ffmpeg_events(path: Path) -> list[tuple[int, int, int]]:
    """(start ms, end ms, lines) of each event of the document converted to ASS by ffmpeg."""
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-i", str(path), "-map", "0", "-c:s", "ass",
         "-f", "null", "-"],
        check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        ass = Path(tmp) / "out.ass"
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-i", str(path), str(ass)],
                       check=True, capture_output=True)
        events = []
        for line in ass.read_text(encoding="utf-8").splitlines():
            if line.startswith("Dialogue:"):
                fields = line.split(",", 9)
                events.append((ass_clock_ms(fields[1]), ass_clock_ms(fields[2]),
                               fields[9].count("\\N") + 1))
        return events


def check_cues(name: str, cues: list[Cue], words: list[str], duration_ms: int,
               args: argparse.Namespace, fail) -> None:
    if not cues and words:
        fail(f"{name}: no cues for {len(words)} words")
    previous_start = 0
    for k, cue in enumerate(cues, 1):
        where = f"{name} cue {k} ({cue.start_ms} ms .. {cue.end_ms} ms)"
        if not 0 <= cue.start_ms <= cue.end_ms <= duration_ms:
            fail(f"{where}: not within [0, {duration_ms}] ms with start <= end")
        if cue.start_ms < previous_start:
            fail(f"{where}: starts before the cue before it")
        previous_start = cue.start_ms
        if cue.end_ms - cue.start_ms > round(args.max_cue_s * 1000):
            fail(f"{where}: lasts more than {args.max_cue_s} s")
        if not 1 <= len(cue.lines) <= args.max_lines:
            fail(f"{where}: {len(cue.lines)} lines, more than {args.max_lines}")
        for i, line in enumerate(cue.lines):
            shown = line[len(cue.label):] if i == 0 else line
            if not shown.strip() or shown != shown.strip():
                fail(f"{where}: empty line or stray spaces {line!r}")
            if len(line) > args.max_line_chars and " " in shown:
                fail(f"{where}: {len(line)} characters, more than {args.max_line_chars}: "
                     f"{line!r}")
    said = " ".join(" ".join(c.lines)[len(c.label):] for c in cues).split()
    if said != words:
        fail(f"{name}: the cues do not carry the words in order, each once:\n"
             f"  cues:  {' '.join(said)}\n  words: {' '.join(words)}")


def check_ffmpeg(name: str, path: Path, cues: list[Cue], fail) -> None:
    try:
        events = ffmpeg_events(path)
    except subprocess.CalledProcessError as e:
        fail(f"{name}: ffmpeg exited {e.returncode}: {e.stderr.decode(errors='replace')}")
        return
    if len(events) != len(cues):
        fail(f"{name}: ffmpeg read {len(events)} events of {len(cues)} cues")
        return
    for k, ((start, end, lines), cue) in enumerate(zip(events, cues), 1):
        # ASS times are centiseconds.
        if abs(start - cue.start_ms) > 10 or abs(end - cue.end_ms) > 10 or lines != len(cue.lines):
            fail(f"{name} cue {k}: ffmpeg read {start}..{end} ms, {lines} lines; the parser "
                 f"{cue.start_ms}..{cue.end_ms} ms, {len(cue.lines)} lines")


def check_verbose_json(name: str, doc: dict, duration_ms: int, classes: int | None, fail) -> None:
    try:
        TranscriptionVerbose.model_validate(doc)
    except pydantic.ValidationError as e:
        fail(f"{name}: not an OpenAI TranscriptionVerbose: {e}")
    for kind in ("segments", "words"):
        for item in doc[kind]:
            start, end = ms(item["start"]), ms(item["end"])
            if not 0 <= start <= end <= duration_ms:
                fail(f"{name} {kind[:-1]} {item}: not within [0, {duration_ms}] ms")
    for seg in doc["segments"]:
        b = seg["text"].encode("utf-8")
        want = len(b) / len(zlib.compress(b))
        if seg.get("compression_ratio") != want:
            fail(f"{name} segment {seg['id']}: compression_ratio {seg.get('compression_ratio')}"
                 f" != zlib's {want}")
        if seg.get("temperature") != 0:
            fail(f"{name} segment {seg['id']}: temperature {seg.get('temperature')}, not 0")
        logprob, no_speech = seg.get("avg_logprob"), seg.get("no_speech_prob")
        floor = -math.log(classes) if classes else -math.inf
        if not isinstance(logprob, float) or not floor <= logprob <= 0:
            fail(f"{name} segment {seg['id']}: avg_logprob {logprob} not in [{floor}, 0]")
        if not isinstance(no_speech, (int, float)) or not 0 <= no_speech <= 1:
            fail(f"{name} segment {seg['id']}: no_speech_prob {no_speech} not in [0, 1]")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-cue-s", type=float, default=7.0)
    parser.add_argument("--max-line-chars", type=int, default=42)
    parser.add_argument("--max-lines", type=int, default=2)
    parser.add_argument("--classes", type=int, help="the model's labels (vocabulary + blank)")
    parser.add_argument("--verbose-json", type=Path, required=True)
    parser.add_argument("documents", type=Path, nargs="+")
    args = parser.parse_args()

    failures: list[str] = []
    doc = json.loads(args.verbose_json.read_text(encoding="utf-8"))
    duration_ms = ms(doc["duration"])
    words = " ".join(w["word"] for w in doc["words"]).split()
    check_verbose_json(args.verbose_json.name, doc, duration_ms, args.classes, failures.append)
    for path in args.documents:
        if path.suffix == ".srt":
            cues = srt_cues(path)
        elif path.suffix == ".vtt":
            cues = vtt_cues(path)
        else:
            failures.append(f"{path}: neither .srt nor .vtt")
            continue
        check_cues(path.name, cues, words, duration_ms, args, failures.append)
        check_ffmpeg(path.name, path, cues, failures.append)
        print(f"{path.name}: {len(cues)} cues, {len(words)} words, {duration_ms} ms")
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
