"""Record NeMo's own TDT text and timestamp computation on hand-made and random token sequences.

The model-fixture parity tests only see what a random-weight model happens to emit; these cases
aim at the edge cases of detokenisation, punctuation snapping and word/segment grouping
(punctuation first, consecutive punctuation, bare `▁` pieces, `<unk>`, byte-fallback pieces,
tokens repeated at one frame, segment gap thresholds). The Rust test
`models/tests/timestamps_nemo_cases.rs` replays them.

Run with the NeMo venv (CPU is enough):
    /work/venvs/nemo/bin/python scripts/timestamp_cases.py models/tests/data/timestamp_cases.json
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
from pathlib import Path

import sentencepiece as spm
import torch
from omegaconf import OmegaConf

CORPUS = """
The weather today is sunny, with a light breeze from the west.
Please remember to bring three apples, two oranges and a loaf of bread!
Is it half past nine? Yes. No! Maybe... "Quoted words" and (brackets); colons: here.
Don't stop; it's the doctor's note - well-known, self-evident, rock 'n' roll.
Numbers: 1, 2, 3, 42 and 1999. Mr. Smith met Dr. Jones at 5 p.m. on Tuesday.
Café, naïve, façade, résumé cost 5 € or £4 — a bargain… she said «bonjour».
We should meet again next week, maybe on Tuesday or Wednesday afternoon?
A journey of a thousand miles begins with a single step. Hello world!
"""

SECONDS_WINDOW_STRIDE = 0.01
SUBSAMPLING = 8
DURATIONS = [0, 1, 2, 3, 4]


def train(out_dir: Path, name: str, vocab_size: int, byte_fallback: bool) -> Path:
    corpus = out_dir / "corpus.txt"
    corpus.write_text(CORPUS.strip() + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out_dir / name),
        model_type="bpe",
        vocab_size=vocab_size,
        character_coverage=0.98 if byte_fallback else 1.0,
        byte_fallback=byte_fallback,
        bos_id=-1,
        eos_id=-1,
        unk_id=0,
        num_threads=1,
        minloglevel=2,
    )
    return out_dir / f"{name}.model"


def make_decoding(model_path: Path, segment_gap_threshold):
    from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint
    from nemo.collections.asr.parts.submodules.rnnt_decoding import RNNTBPEDecoding, RNNTBPEDecodingConfig
    from nemo.collections.common.tokenizers import SentencePieceTokenizer

    tok = SentencePieceTokenizer(str(model_path))
    vocab_size = tok.vocab_size
    # What ASRBPEMixin does to the wrapped processor before building the decoding.
    tok.tokenizer.vocab_size = vocab_size
    dec = RNNTDecoder(prednet={"pred_hidden": 8, "pred_rnn_layers": 1}, vocab_size=vocab_size, blank_as_pad=True)
    joint = RNNTJoint(
        jointnet={"encoder_hidden": 8, "pred_hidden": 8, "joint_hidden": 8, "activation": "relu"},
        num_classes=vocab_size,
        num_extra_outputs=len(DURATIONS),
    )
    cfg = OmegaConf.structured(
        RNNTBPEDecodingConfig(
            model_type="tdt",
            strategy="greedy_batch",
            durations=DURATIONS,
            compute_timestamps=True,
            segment_gap_threshold=segment_gap_threshold,
        )
    )
    return tok, RNNTBPEDecoding(cfg, dec, joint, tok)


def run_nemo(decoding, ids, frames, durations):
    from nemo.collections.asr.parts.utils.rnnt_utils import Hypothesis
    from nemo.collections.asr.parts.utils.timestamp_utils import process_timestamp_outputs

    hyp = Hypothesis(
        score=0.0,
        y_sequence=torch.tensor(ids, dtype=torch.long),
        timestamp=torch.tensor(frames, dtype=torch.long),
        token_duration=torch.tensor(durations, dtype=torch.long),
    )
    hyp = decoding.decode_hypothesis([hyp])[0]
    hyp = decoding.compute_rnnt_timestamps(hyp)
    hyp = process_timestamp_outputs([hyp], SUBSAMPLING, SECONDS_WINDOW_STRIDE)[0]
    ts = hyp.timestamp
    return {
        "text": hyp.text,
        "tokens": [
            {"id": i, "text": c["char"][0], "start_offset": c["start_offset"], "end_offset": c["end_offset"],
             "start": c["start"], "end": c["end"]}
            for i, c in zip(ids, ts["char"])
        ],
        "words": [
            {k: w[k] for k in ("word", "start_offset", "end_offset", "start", "end")} for w in ts["word"]
        ],
        "segments": [
            {k: s[k] for k in ("segment", "start_offset", "end_offset", "start", "end")} for s in ts["segment"]
        ],
    }


def classify(sp) -> dict[str, list[int]]:
    kinds = {"word_start": [], "inner": [], "punct": [], "bare": [], "special": [], "byte": []}
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_byte(i):
            kinds["byte"].append(i)
        elif sp.is_unknown(i) or sp.is_control(i):
            kinds["special"].append(i)
        elif piece == "▁":
            kinds["bare"].append(i)
        elif all(not ch.isalnum() for ch in piece.lstrip("▁")):
            kinds["punct"].append(i)
        elif piece.startswith("▁"):
            kinds["word_start"].append(i)
        else:
            kinds["inner"].append(i)
    return kinds


def random_ids(rng: random.Random, kinds, n: int) -> list[int]:
    weights = {"word_start": 30, "inner": 25, "punct": 18, "bare": 6, "special": 4, "byte": 8}
    pool = [k for k in weights if kinds[k]]
    out = []
    for _ in range(n):
        kind = rng.choices(pool, [weights[k] for k in pool])[0]
        out.append(rng.choice(kinds[kind]))
    return out


def random_timing(rng: random.Random, n: int, start: int) -> tuple[list[int], list[int]]:
    frames, durations = [], []
    t = start
    for _ in range(n):
        d = rng.choices(DURATIONS, [3, 4, 3, 2, 1])[0]
        frames.append(t)
        durations.append(d)
        t += d + rng.choice([0, 0, 1, 2, 5])
    return frames, durations


def piece_ids(sp, pieces: list[str]) -> list[int]:
    ids = []
    for p in pieces:
        i = sp.piece_to_id(p)
        assert sp.id_to_piece(i) == p, f"piece {p!r} not in vocabulary"
        ids.append(i)
    return ids


def hand_cases(sp) -> list[tuple[str, list[int]]]:
    """Sequences of pieces present in both tokenizers (checked by piece_ids)."""
    have = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    wanted = [
        ("empty", []),
        ("first_without_space_marker", ["he", "▁the"]),
        ("punctuation_first", [".", "▁the"]),
        ("only_punctuation", [",", ".", "?"]),
        ("consecutive_punctuation", ["▁the", ".", ".", "."]),
        ("bare_marker_then_punctuation", ["▁the", "▁", ",", "▁a"]),
        ("bare_marker_last", ["▁the", "▁"]),
        ("unknown_pieces", ["<unk>", "▁the", "<unk>", "."]),
        ("segments", ["▁the", ".", "▁a", "?", "▁the", "!", "▁a"]),
        ("apostrophe", ["▁it", "'", "s", "▁the"]),
    ]
    out = []
    for name, pieces in wanted:
        if all(p in have for p in pieces):
            out.append((name, piece_ids(sp, pieces)))
    return out


def cases_for(sp, rng: random.Random, byte_fallback: bool):
    cases = [(name, ids, None) for name, ids in hand_cases(sp)]
    if byte_fallback:
        bytes_of = lambda s: [sp.piece_to_id(f"<0x{b:02X}>") for b in s.encode("utf-8")]
        the = sp.piece_to_id("▁the")
        cases.append(("byte_multibyte_char", [the] + bytes_of("€") + [the], None))
        cases.append(("byte_truncated_char", bytes_of("€")[:2] + [the], None))
        cases.append(("byte_space_first", bytes_of(" ") + [the, the], None))
        cases.append(("byte_period", [the] + bytes_of(".") + [the], None))
    kinds = classify(sp)
    for k in range(40):
        cases.append((f"random_{k}", random_ids(rng, kinds, rng.randint(1, 30)), None))
    for k in range(8):
        cases.append((f"gap_threshold_{k}", random_ids(rng, kinds, rng.randint(5, 30)), rng.choice([1, 2, 3, 6])))
    return cases


def main() -> None:
    out_path = Path(sys.argv[1])
    rng = random.Random(20261130)
    tokenizers = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, vocab_size, byte_fallback in [("plain", 160, False), ("byte_fallback", 420, True)]:
            model_path = train(Path(tmp), name, vocab_size, byte_fallback)
            sp = spm.SentencePieceProcessor(model_file=str(model_path))
            decodings = {}
            cases = []
            for case_name, ids, gap in cases_for(sp, rng, byte_fallback):
                if gap not in decodings:
                    decodings[gap] = make_decoding(model_path, gap)[1]
                start = rng.choice([0, 0, 3, 1234])
                frames, durations = random_timing(rng, len(ids), start)
                if case_name == "consecutive_punctuation":
                    frames = [frames[0]] * len(ids)  # all emitted at one frame
                    durations = [0] * len(ids)
                result = run_nemo(decodings[gap], ids, frames, durations)
                cases.append(
                    {"name": case_name, "segment_gap_threshold": gap, "token_ids": ids,
                     "token_frames": frames, "token_durations": durations, **result}
                )
            tokenizers.append(
                {
                    "tokenizer": name,
                    "vocabulary": [sp.id_to_piece(i) for i in range(sp.get_piece_size())],
                    "supported_punctuation": sorted(make_decoding(model_path, None)[1].supported_punctuation),
                    "cases": cases,
                }
            )
    doc = {
        "generator": "scripts/timestamp_cases.py",
        "window_stride_s": SECONDS_WINDOW_STRIDE,
        "subsampling_factor": SUBSAMPLING,
        "tokenizers": tokenizers,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    # One case per line: small, and diffs stay readable.
    text = json.dumps(doc, ensure_ascii=False)
    text = text.replace(', {"name": ', ',\n {"name": ')
    out_path.write_text(text + "\n")
    print(f"wrote {sum(len(t['cases']) for t in tokenizers)} cases to {out_path}")


if __name__ == "__main__":
    main()
