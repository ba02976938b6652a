"""The model API stand-in: paced token streams, usage, and a tokens-per-minute limit that
answers real 429s with Retry-After (tests and benchmarks of the LLM workload use it)."""

from __future__ import annotations

import json

import httpx
import pytest

from brook.testing.model_api import Limiter, ModelAPI, words


def _chat(url: str, **body: object) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "alpha beta gamma"}])
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)


def test_a_stream_sends_each_token_then_usage_then_done() -> None:
    with ModelAPI(tokens=5, seconds=0.05).running() as api:
        chunks: list[str] = []
        with httpx.stream(
            "POST",
            f"{api.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "alpha beta gamma"}], "stream": True},
            timeout=10,
        ) as reply:
            assert reply.status_code == 200
            assert reply.headers["content-type"].startswith("text/event-stream")
            chunks = [ln[6:] for ln in reply.iter_lines() if ln.startswith("data: ")]
        assert chunks[-1] == "[DONE]"
        events = [json.loads(c) for c in chunks[:-1]]
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
        assert text == "alpha beta gamma alpha beta "
        assert events[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
        stats = httpx.get(f"{api.url}/stats").json()
        assert stats["tokens_sent"] == 5 and stats["answered"] == 1


def test_a_whole_answer_names_its_usage() -> None:
    with ModelAPI(tokens=3, seconds=0).running() as api:
        reply = _chat(api.url, max_tokens=7)
        assert reply.status_code == 200
        body = reply.json()
        assert body["choices"][0]["message"]["content"] == "".join(words("alpha beta gamma", 7))
        assert body["usage"]["completion_tokens"] == 7


def test_over_the_limit_is_a_429_with_retry_after_and_is_not_charged() -> None:
    # 4 prompt tokens + 10 completion tokens = 14 a call; 30 a window: two fit, the third not.
    with ModelAPI(tokens=10, seconds=0, tpm=30, window_s=600).running() as api:
        assert _chat(api.url).status_code == 200
        assert _chat(api.url).status_code == 200
        refused = _chat(api.url)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(refused.headers["Retry-After"]) <= 600
        assert int(refused.headers["retry-after-ms"]) > 0
        assert refused.headers["x-ratelimit-remaining-tokens"] == "2"
        # A smaller call still fits what is left: the refused one took nothing.
        assert _chat(api.url, max_tokens=1, messages=[{"role": "user", "content": "x"}]).status_code == 200
        stats = httpx.get(f"{api.url}/stats").json()
        assert stats["rate_limited"] == 1 and stats["tokens_charged"] == 30


def test_the_window_slides() -> None:
    limiter = Limiter(tpm=10, window_s=60)
    assert limiter.take(6, now=0.0) is None
    assert limiter.take(4, now=30.0) is None
    wait = limiter.take(5, now=40.0)
    assert wait == pytest.approx(20.0)  # the first charge leaves the window at 60 s
    assert limiter.take(5, now=60.0) is None
    assert limiter.remaining(now=60.0) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"messages": "hi"},
        {"messages": [{"content": 3}]},
        {"max_tokens": 0},
        {"max_tokens": True},
        {"seconds": -1},
        {"seconds": 1e9},
    ],
)
def test_a_bad_request_is_a_400_and_charges_nothing(body: dict[str, object]) -> None:
    with ModelAPI(tokens=1, seconds=0, tpm=100).running() as api:
        reply = httpx.post(f"{api.url}/v1/chat/completions", json=body, timeout=10)
        assert reply.status_code == 400, reply.text
        assert httpx.get(f"{api.url}/stats").json()["tokens_charged"] == 0


def test_a_request_over_the_whole_limit_is_refused_for_good() -> None:
    with ModelAPI(tokens=1, seconds=0, tpm=5).running() as api:
        reply = _chat(api.url, max_tokens=50)
        assert reply.status_code == 400
        assert reply.json()["error"]["code"] == "request_too_large"


def test_it_runs_as_a_child_process() -> None:
    with ModelAPI(tokens=2, seconds=0).process() as api:
        assert api.port
        assert _chat(api.url).json()["usage"]["completion_tokens"] == 2
