"""Built-in rewards under hostile input: linear-time regexes, bounded JSON validation, and an
HTTP client that keeps credentials on their origin and caps what it reads (issue #19)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import make_config, run_grpo, write_config

import grpo_core

# The work one call may do on a ~100k-character input, as the CPU time this process spends on
# it (not wall time: a loaded machine makes a call wait for a core, which is not counted). The
# backtracking and quadratic scans these tests guard against need 10 s to years.
FAST = 2.0


def create(name, **options):
    return grpo_core.create("reward", name, options)


def timed(fn, *args):
    t0 = time.process_time()
    out = fn(*args)
    return list(out), time.process_time() - t0


def one_line_error(exc_info, *parts):
    text = str(exc_info.value)
    assert "\n" not in text, text
    for part in parts:
        assert part in text, text
    return text


# --- format ----------------------------------------------------------------------------------


def test_format_backtracking_pattern_is_linear():
    # Python's re needs ~1.7 s for this pattern on 25 characters and doubles per character.
    r = create("format", tags=[], patterns=[r"^(\w+\s?)*$"])
    out, took = timed(r, ["p"], ["a" * 99_999 + "!"])
    assert out == [0.0] and took < FAST, took
    assert list(r(["p"] * 2, ["two words", "no!"])) == [1.0, 0.0]


def test_format_tag_scan_is_linear_on_long_completions():
    r = create("format", tags=["think", "answer"], partial=True)
    many_opens = "<think>" * 14_000  # 98k characters; ~10 s with the backtracking scan
    one_open = "<think>" + "</thin" * 16_000 + "<answer>1</answer>"
    out, took = timed(r, ["p"] * 2, [many_opens, one_open])
    assert took < FAST, took
    assert out == [0.0, 1 / 3]  # only "answer once" holds in the second
    good = "<think>a\nb</think>\n<answer>4</answer>"
    assert list(r(["p"], [good])) == [1.0]


def test_format_dollar_matches_before_a_final_newline_as_before():
    r = create("format", tags=[], patterns=[r"^Answer: \d+$"])
    assert list(r(["p"] * 3, ["Answer: 12\n", "Answer: 12\n\n", "Answer: 12 x"])) == [1.0, 0.0, 0.0]


def test_format_survives_lone_surrogates():
    r = create("format", tags=["answer"], patterns=["[0-9]"])
    assert list(r(["p"], ["<answer>\ud8007</answer>"])) == [1.0]


@pytest.mark.parametrize(
    "pattern,reason",
    [
        ("a(?=b)", "(lookahead)"),
        ("(?<!a)b", "(lookbehind)"),
        (r"(a)\1", r"backreference \1"),
        ("(?>a+)b", "atomic group"),
        ("a++", "possessive quantifier"),
        (r"end\Z", r"write \z"),
    ],
)
def test_format_refuses_patterns_re2_cannot_run(pattern, reason):
    with pytest.raises(grpo_core.PluginError) as info:
        create("format", tags=[], patterns=["[0-9]", pattern])
    one_line_error(
        info,
        "reward format: patterns[1]: ",
        repr(pattern),
        "not supported by the linear-time regex engine",
        reason,
    )


def test_format_refuses_invalid_regex():
    with pytest.raises(grpo_core.PluginError) as info:
        create("format", tags=[], patterns=["(unclosed"])
    one_line_error(
        info, "reward format: patterns[0]: '(unclosed' is not a valid regex", "missing )"
    )


# --- json_schema -----------------------------------------------------------------------------


def test_json_schema_backtracking_pattern_is_linear():
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}}}
    r = create("json_schema", schema=schema)
    hostile = json.dumps({"name": "a" * 100_000 + "!"})
    out, took = timed(r, ["p"], [hostile])
    assert out == [0.0] and took < FAST, took
    assert list(r(["p"] * 2, ['{"name": "aaa"}', '{"name": "aab"}'])) == [1.0, 0.0]
    col = create("json_schema", schema_column="schema")
    out, took = timed(
        lambda p, c: col(p, c, schema=[schema, json.dumps(schema)]),
        ["p"] * 2,
        [hostile, '{"name": "a"}'],
    )
    assert out == [0.0, 1.0] and took < FAST, took


def test_json_schema_pattern_properties_and_additional_properties_are_linear():
    schema = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    r = create("json_schema", schema=schema)
    out, took = timed(r, ["p"], [json.dumps({"a" * 100_000 + "!": 1})])
    assert out == [0.0] and took < FAST, took
    assert list(r(["p"] * 3, ['{"aa": 1}', '{"aa": "x"}', '{"b": 1}'])) == [1.0, 0.0, 0.0]
    typed = create("json_schema", schema={**schema, "additionalProperties": {"type": "string"}})
    assert list(typed(["p"] * 2, ['{"aa": 1, "b": "s"}', '{"b": 2}'])) == [1.0, 0.0]


def test_json_schema_dollar_schema_does_not_bring_back_the_backtracking_engine():
    # "$schema" makes jsonschema switch to its stock class below a "$ref": "#"; the reward
    # must still validate that part with RE2.
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "anyOf": [
            {"type": "string", "pattern": "^(a+)+$"},
            {"type": "array", "items": {"$ref": "#"}},
        ],
    }
    r = create("json_schema", schema=schema)
    out, took = timed(r, ["p"], [json.dumps([["a" * 50_000 + "!"]])])
    assert out == [0.0] and took < FAST, took
    assert list(r(["p"] * 2, ['[["aa"], "a"]', '[["b"]]'])) == [1.0, 0.0]


def test_json_schema_unique_items_is_linear():
    r = create("json_schema", schema={"type": "array", "uniqueItems": True})
    distinct = json.dumps([{"k": i} for i in range(15_000)])  # pairwise compare: minutes
    out, took = timed(r, ["p"], [distinct])
    assert out == [1.0] and took < FAST, took
    same = ['[{"a": 1, "b": [1]}, {"b": [1.0], "a": 1}]', "[1, true]", '[0, false, null, "0"]']
    assert list(r(["p"] * 3, same)) == [0.0, 1.0, 1.0]


def test_json_schema_deep_nesting_and_size_score_zero():
    r = create("json_schema", schema={"items": {"$ref": "#"}})
    texts = [
        "[" * 100_000 + "]" * 100_000,
        "[" * 900 + "]" * 900,
        "[" * 3 + "]" * 3,
        "[" + "0," * 150_000 + "0]",
    ]
    out, took = timed(r, ["p"] * 4, texts)
    assert out == [0.0, 0.0, 1.0, 0.0] and took < FAST, took


def test_json_schema_fence_scan_is_linear():
    r = create("json_schema", schema={"type": "object"})
    out, took = timed(r, ["p"] * 2, ["```" + " " * 150_000, "see:\n```json\n{}\n```"])
    assert out == [0.0, 1.0] and took < FAST, took


def test_json_schema_validation_time_is_capped():
    # unevaluatedItems under a recursive anyOf doubles the work per nesting level
    schema = {"anyOf": [{"items": {"$ref": "#"}}, {"type": "null"}], "unevaluatedItems": False}
    r = create("json_schema", schema=schema, validation_timeout=0.2)
    out, took = timed(r, ["p"] * 2, ["[" * 40 + "]" * 40, "[[null]]"])
    assert out == [0.0, 1.0] and took < FAST, took


def test_json_schema_partial_resolves_references_from_the_root():
    schema = {
        "$defs": {"n": {"type": "integer"}},
        "required": ["a"],
        "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"type": "string"}},
    }
    r = create("json_schema", schema=schema, partial=True)
    assert list(r(["p"] * 2, ['{"a": 1, "b": "x"}', '{"a": "x", "b": 1}'])) == [1.0, 1 / 3]


@pytest.mark.parametrize(
    "schema,parts",
    [
        ({"type": 5}, ["reward json_schema: schema.type: "]),
        (
            {"properties": {"n": {"minimum": "zero"}}},
            ["reward json_schema: schema.properties.n.minimum: ", "'zero' is not of type 'number'"],
        ),
        (
            {"properties": {"n": {"type": "string", "pattern": "a(?=b)"}}},
            [
                "reward json_schema: schema.properties.n.pattern: 'a(?=b)' is not supported by the "
                "linear-time regex engine (lookahead)"
            ],
        ),
        (
            {"patternProperties": {"(x": {}}},
            ["reward json_schema: schema.patternProperties: '(x' is not a valid regex"],
        ),
        (
            {"patternProperties": {"^x": {}}, "unevaluatedProperties": False},
            ["unevaluatedProperties together with patternProperties is not supported"],
        ),
    ],
)
def test_json_schema_refuses_bad_schemas_when_built(schema, parts):
    with pytest.raises(grpo_core.PluginError) as info:
        create("json_schema", schema=schema)
    one_line_error(info, *parts)


def test_json_schema_bad_schema_in_a_column_scores_that_item_zero():
    good = {"type": "array"}
    schemas = [
        {"type": 5},
        {"type": "string", "pattern": "(a)\\1"},
        "{not json",
        good,
        json.dumps(good),
        {"$ref": "#/$defs/missing"},
    ]
    r = create("json_schema", schema_column="schema")
    out = list(r(["p"] * 6, ["[]", '"aa"', "[]", "[]", "[]", "[]"], schema=schemas))
    assert out == [0.0, 0.0, 0.0, 1.0, 1.0, 0.0]


# --- through the real CLI --------------------------------------------------------------------


@pytest.mark.parametrize(
    "reward,expect",
    [
        (
            {"name": "format", "options": {"tags": [], "patterns": ["[0-9]", "(?<=x)y"]}},
            "reward.options.patterns[1]: '(?<=x)y' is not supported by the linear-time regex engine",
        ),
        (
            {"name": "json_schema", "options": {"schema": {"properties": {"a": {"type": "nope"}}}}},
            "reward.options.schema.properties.a.type: ",
        ),
    ],
)
def test_train_refuses_bad_reward_patterns_in_one_line(
    tiny_model, addition_data, tmp_path, reward, expect
):
    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"), reward=reward)
    proc = run_grpo("train", write_config(tmp_path / "cfg.json", cfg), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and expect in errors[0], proc.stderr[-2000:]


# --- http ------------------------------------------------------------------------------------


class Server:
    """A real HTTP server on 127.0.0.1 (its own port, so its own origin); ``respond(handler)``
    answers each request; every request is recorded as (method, path, headers, body)."""

    def __init__(self, respond):
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.sent = 0  # body bytes the handler managed to write
        self.done = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                server.requests.append((self.command, self.path, dict(self.headers), body))
                try:
                    respond(server, self)
                finally:
                    server.done.set()

            do_GET = do_POST = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def servers():
    made = []

    def make(respond):
        made.append(Server(respond))
        return made[-1]

    yield make
    for s in made:
        s.close()


def answer(server, h, rewards=(1.0,)):
    out = json.dumps({"rewards": list(rewards)}).encode()
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(out)))
    h.end_headers()
    h.wfile.write(out)


def redirect_to(location_of, code=307):
    def respond(server, h):
        h.send_response(code)
        h.send_header("Location", location_of(server, h))
        h.send_header("Content-Length", "0")
        h.end_headers()

    return respond


SECRETS = {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y", "Cookie": "session=1"}


@pytest.mark.parametrize("code", [302, 307])
def test_http_cross_origin_redirect_is_not_followed(servers, code):
    other = servers(answer)
    first = servers(redirect_to(lambda s, h: other.base + "/score", code=code))
    r = create(
        "http", url=first.base + "/score", headers=SECRETS, timeout=5, retries=2, backoff=0.01
    )
    with pytest.raises(RuntimeError) as info:
        r(["p"], ["c"])
    one_line_error(
        info,
        "redirect to another origin",
        "not followed",
        "allow_cross_origin_redirects",
        "after 1 attempt(s)",
    )
    assert len(first.requests) == 1 and first.requests[0][2]["Authorization"] == "Bearer s3cret"
    assert other.requests == []  # the other origin never hears from us, credentials or not


def test_http_cross_origin_redirect_when_allowed_drops_credentials(servers):
    other = servers(lambda s, h: answer(s, h, [0.5]))
    first = servers(redirect_to(lambda s, h: other.base + "/elsewhere", code=307))
    r = create(
        "http",
        url=first.base + "/score",
        headers=SECRETS,
        timeout=5,
        allow_cross_origin_redirects=True,
    )
    assert list(r(["p"], ["c"])) == [0.5]
    method, path, headers, body = other.requests[0]
    assert (method, path) == ("POST", "/elsewhere") and json.loads(body)["completions"] == ["c"]
    lowered = {k.lower() for k in headers}
    assert not lowered & {"authorization", "x-api-key", "cookie"}, headers
    assert first.requests[0][2]["X-Api-Key"] == "k3y"  # the first origin did get them


def test_http_same_origin_redirect_is_followed_with_credentials(servers):
    def respond(server, h):
        if h.path == "/score":
            return redirect_to(lambda s, _: "/v2/score", code=308)(server, h)
        return answer(server, h, [2.0])

    svc = servers(respond)
    r = create("http", url=svc.base + "/score", headers=SECRETS, timeout=5)
    assert list(r(["p"], ["c"])) == [2.0]
    assert [(m, p) for m, p, _, _ in svc.requests] == [("POST", "/score"), ("POST", "/v2/score")]
    assert svc.requests[1][2]["Authorization"] == "Bearer s3cret"


def test_http_redirects_are_capped(servers):
    loop = servers(redirect_to(lambda s, h: h.path + "x", code=302))
    r = create("http", url=loop.base + "/a", timeout=5, max_redirects=3, retries=2)
    with pytest.raises(RuntimeError) as info:
        r(["p"], ["c"])
    one_line_error(info, "more than max_redirects (3) redirects")
    assert len(loop.requests) == 4  # the request and 3 redirects, no retry


@pytest.mark.parametrize("target", ["file:///etc/passwd", "ftp://127.0.0.1/x"])
def test_http_redirect_to_other_schemes_is_refused(servers, target):
    svc = servers(redirect_to(lambda s, h: target, code=302))
    r = create("http", url=svc.base + "/score", timeout=5, allow_cross_origin_redirects=True)
    with pytest.raises(RuntimeError) as info:
        r(["p"], ["c"])
    one_line_error(info, "refused: only http(s) URLs are followed")


TOTAL = 100 * 1024 * 1024
CAP = 1024 * 1024


def stream_padding(server, h, announce=False):
    """Send up to 100 MB of JSON-ish padding in 64 KiB writes, counting what gets out."""
    h.send_response(200)
    if announce:
        h.send_header("Content-Length", str(TOTAL))
    h.end_headers()
    chunk = b" " * 65536
    try:
        while server.sent < TOTAL:
            h.wfile.write(chunk)
            server.sent += len(chunk)
    except OSError:
        pass  # the client hung up, as it should


def test_http_oversize_reply_is_cut_off(servers):
    svc = servers(stream_padding)
    r = create("http", url=svc.base + "/score", timeout=5, max_response_bytes=CAP, retries=2)
    with pytest.raises(RuntimeError) as info:
        r(["p"], ["c"])
    one_line_error(info, f"over max_response_bytes ({CAP}); reading stopped")
    assert svc.done.wait(10)
    # the client read at most CAP + one chunk; what else got out sat in socket buffers
    assert svc.sent < 32 * 1024 * 1024, svc.sent
    assert len(svc.requests) == 1  # not retried


def test_http_announced_oversize_reply_is_refused_unread(servers):
    svc = servers(lambda s, h: stream_padding(s, h, announce=True))
    r = create("http", url=svc.base + "/score", timeout=5, max_response_bytes=CAP)
    with pytest.raises(RuntimeError) as info:
        r(["p"], ["c"])
    one_line_error(info, f"reply of {TOTAL} bytes announced, over max_response_bytes")
    assert svc.done.wait(10)
    assert svc.sent < 32 * 1024 * 1024, svc.sent


CLIENT = """
import sys
import grpo_core
from grpo_core.observe.metrics import peak_rss_bytes, reset_peak_rss
r = grpo_core.create("reward", "http", {"url": sys.argv[1], "timeout": 5, "retries": 0,
                                        "max_response_bytes": CAP})
before = reset_peak_rss()
try:
    r(["p"], ["c"])
except RuntimeError as exc:
    print("error:", exc, file=sys.stderr)
print((peak_rss_bytes() - before) // 2**20)
""".replace("CAP", str(CAP))


def test_http_oversize_reply_does_not_grow_client_memory(servers):
    svc = servers(stream_padding)
    proc = subprocess.run(
        [sys.executable, "-c", CLIENT, svc.base + "/score"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "over max_response_bytes" in proc.stderr
    grew_mb = int(proc.stdout.split()[-1])
    assert grew_mb < 50, grew_mb  # reading the 100 MB body would grow it by over 100
