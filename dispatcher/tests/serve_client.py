"""The official `openai` package against `dispatcher serve` (driven by serve.rs).

Usage: serve_client.py BASE_URL API_KEY CLIP OUT_DIR [--too-large FILE] [--not-audio FILE]

Transcribes CLIP in every response format (raw body to OUT_DIR/<format>, after the client
parsed it as it parses OpenAI's answers), lists the models, and tries the error cases; prints one
JSON object with what each call gave (status codes, exception classes, model ids).
"""

import json
import sys
from pathlib import Path

import openai
from openai import OpenAI


def status_of(call):
    """The exception class and status code a failing call raises."""
    try:
        call()
    except openai.APIStatusError as e:
        body = e.response.json()
        return {
            "exception": type(e).__name__,
            "status": e.status_code,
            "code": body["error"]["code"],
            "type": body["error"]["type"],
            "retry_after": e.response.headers.get("retry-after"),
        }
    return {"exception": None}


def main():
    base, key, clip, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    rest = sys.argv[5:]
    extra = dict(zip(rest[::2], rest[1::2]))
    client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    report = {"formats": {}}
    for fmt in ["json", "text", "srt", "vtt", "verbose_json"]:
        kwargs = {}
        if fmt == "verbose_json":
            kwargs["timestamp_granularities"] = ["word", "segment"]
        with clip.open("rb") as f:
            raw = client.audio.transcriptions.with_raw_response.create(
                file=f, model="whisper-1", response_format=fmt, language="en", **kwargs
            )
        parsed = raw.parse()
        # What the client hands the caller: an object with .text for json formats, a string
        # for the others.
        text = parsed if isinstance(parsed, str) else parsed.text
        (out / fmt).write_text(raw.http_response.text)
        report["formats"][fmt] = {
            "status": raw.http_response.status_code,
            "content_type": raw.http_response.headers.get("content-type"),
            "parsed_type": type(parsed).__name__,
            "text_chars": len(text),
        }
    report["models"] = [m.id for m in client.models.list()]

    def transcribe(file, **kwargs):
        def call():
            with Path(file).open("rb") as f:
                client.audio.transcriptions.create(file=f, **kwargs)

        return call

    bad_key = OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0)
    report["errors"] = {
        "wrong_key": status_of(
            lambda: bad_key.audio.transcriptions.create(file=clip.open("rb"), model="whisper-1")
        ),
        "unknown_model": status_of(transcribe(clip, model="gpt-4o-transcribe")),
        "bad_format": status_of(transcribe(clip, model="whisper-1", response_format="docx")),
        "unsupported_language": status_of(transcribe(clip, model="whisper-1", language="de")),
        "rttm_without_diarize": status_of(
            transcribe(clip, model="whisper-1", response_format="rttm")
        ),
    }
    if "--too-large" in extra:
        report["errors"]["too_large"] = status_of(
            transcribe(extra["--too-large"], model="whisper-1")
        )
    if "--not-audio" in extra:
        report["errors"]["not_audio"] = status_of(
            transcribe(extra["--not-audio"], model="whisper-1")
        )
    print(json.dumps(report))


if __name__ == "__main__":
    main()
