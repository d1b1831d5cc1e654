"""The ``/v1`` API over real HTTP, against ``loopwright serve`` in a subprocess (issue 13, items 2 and 5).

The agents are the CLI tests' (``core/tests/cli_fixtures``): a replay provider plays each one's
script, so every run is the same in any process. One server serves the module's tests; each
test starts its own instances and looks only at them.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from _serve_testlib import Server, cli, project, read_events, rests_in, serving

from loopwright import INSTANCE_ID_RULE
from loopwright_serve._api import ENDPOINTS, StartBody
from loopwright_serve._schema import json_schema

if TYPE_CHECKING:
    import httpx

pytestmark = pytest.mark.slow

REST = ("waiting", "waiting_for_approval", "stopped", "error")


@pytest.fixture(scope="module")
def assembly(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return project(tmp_path_factory.mktemp("serve-api"))


@pytest.fixture(scope="module")
def server(assembly: Path) -> Iterator[Server]:
    with serving(assembly) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def start(client: httpx.Client, definition: str, **body: object) -> dict:
    response = client.post("/v1/instances", json={"definition": definition, **body})
    assert response.status_code == 201, response.text
    return response.json()


def wait_rest(client: httpx.Client, instance_id: str, *states: str) -> dict:
    read_events(client, instance_id, rests_in(*(states or REST)))
    return client.get(f"/v1/instances/{instance_id}").json()


def test_healthz_and_the_openapi_document_name_every_route(client: httpx.Client) -> None:
    health = client.get("/healthz")
    assert health.json()["status"] == "ok"
    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    operations = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert operations == {(ep.path, ep.method.lower()) for ep in ENDPOINTS}
    # The body schema is the one the handler checks against, derived from the same class.
    assert doc["components"]["schemas"]["StartBody"] == json_schema(StartBody)
    assert doc["paths"]["/v1/instances"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/StartBody"}


def test_start_show_list_and_filter(client: httpx.Client) -> None:
    response = client.post("/v1/instances", json={"definition": "chat", "prompt": "hello"})
    assert response.status_code == 201
    created = response.json()
    iid = created["instanceId"]
    assert response.headers["location"] == f"/v1/instances/{iid}"
    assert created["name"] == "chat"
    shown = wait_rest(client, iid, "waiting")
    assert shown["state"] == "waiting"
    assert shown["tree"]["instanceId"] == iid
    assert shown["treePendingApprovals"] == []
    listed = client.get("/v1/instances", params={"name": "chat"}).json()
    assert iid in [s["instanceId"] for s in listed]
    assert all(s["name"] == "chat" for s in listed)
    waiting = client.get("/v1/instances", params={"state": "waiting"}).json()
    assert iid in [s["instanceId"] for s in waiting]
    assert iid not in [s["instanceId"] for s in client.get("/v1/instances", params={"state": "error"}).json()]
    trees = client.get("/v1/instances", params={"tree": "true"}).json()
    assert iid in [node["instanceId"] for node in trees]
    assert {"children", "waitingOn", "turns"} <= set(trees[0])
    bad = client.get("/v1/instances", params={"state": "sleeping"})
    assert bad.status_code == 422
    assert bad.headers["content-type"] == "application/problem+json"


def test_the_summaries_are_the_clis(client: httpx.Client, assembly: Path) -> None:
    """GET /v1/instances/ID is `show --json`, GET /v1/instances is `ls --json`."""
    iid = start(client, "done")["instanceId"]
    wait_rest(client, iid)
    over_http = client.get(f"/v1/instances/{iid}").json()
    from_cli = json.loads(cli(assembly, "show", iid, "--json").stdout)
    assert over_http == from_cli
    listed = {s["instanceId"]: s for s in client.get("/v1/instances").json()}
    from_ls = {s["instanceId"]: s for s in json.loads(cli(assembly, "ls", "--json").stdout)}
    assert listed[iid] == from_ls[iid]


def test_inputs_are_checked_and_used(client: httpx.Client) -> None:
    bad = client.post("/v1/instances", json={"definition": "inputs", "inputs": {"count": "many"}})
    assert bad.status_code == 422
    assert bad.json()["errors"]
    good = start(client, "inputs", inputs={"count": 3, "flag": True, "name": "x", "notes": "n"})
    assert wait_rest(client, good["instanceId"])["state"] == "waiting"


def test_approve_through_the_api_records_the_decider(client: httpx.Client) -> None:
    iid = start(client, "approve", prompt="clean up")["instanceId"]
    shown = wait_rest(client, iid, "waiting_for_approval")
    (pending,) = shown["treePendingApprovals"]
    # The runtime's own id (the model named it call_del), and the digest a decision must carry.
    assert re.fullmatch(r"lw-1-0-[0-9a-f]{6}", pending["toolCallId"])
    assert pending["arguments"] == {"path": "old/notes.txt"}
    assert pending["digest"] == shown["pendingApprovals"][0]["digest"]
    call = pending["toolCallId"]
    response = client.post(f"/v1/instances/{iid}/approvals/{call}", json={"decision": "approve",
                                                                          "digest": pending["digest"]})
    assert response.status_code == 200, response.text
    (decided,) = response.json()["decided"]
    assert decided["decision"] == "approved"
    assert decided["decidedBy"] == "local"
    assert wait_rest(client, iid, "waiting")["state"] == "waiting"
    approvals = client.get(f"/v1/instances/{iid}/records", params={"kind": "approval"}).json()
    assert approvals[-1]["data"] == {"toolCallId": call, "tool": "delete", "decision": "approved",
                                     "reason": None, "by": "local"}
    again = client.post(f"/v1/instances/{iid}/approvals/{call}", json={"decision": "approve",
                                                                       "digest": pending["digest"]})
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"


def test_a_decision_on_another_digest_is_refused_and_nothing_runs(client: httpx.Client) -> None:
    """A digest that is not the pending call's: 409 naming the current digest; the call stays held, undecided."""
    iid = start(client, "approve")["instanceId"]
    (pending,) = wait_rest(client, iid, "waiting_for_approval")["pendingApprovals"]
    call = pending["toolCallId"]
    for decision in ("approve", "deny"):
        refused = client.post(f"/v1/instances/{iid}/approvals/{call}", json={"decision": decision,
                                                                              "digest": "f" * 64})
        assert refused.status_code == 409, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        problem = refused.json()
        assert (problem["instanceId"], problem["toolCallId"], problem["currentDigest"]) == (
            iid, call, pending["digest"])
        assert pending["digest"] in problem["detail"]
    # Without one at all, a 422 naming the field; with a digest that is no sha256, a 422 too.
    for body in ({"decision": "approve"}, {"decision": "approve", "digest": pending["digest"][:16]}):
        blind = client.post(f"/v1/instances/{iid}/approvals/{call}", json=body)
        assert blind.status_code == 422, blind.text
        assert "digest" in json.dumps(blind.json()["errors"])
    shown = client.get(f"/v1/instances/{iid}").json()
    assert shown["state"] == "waiting_for_approval"
    assert [(p["toolCallId"], p["digest"], p["decision"]) for p in shown["pendingApprovals"]] == [
        (call, pending["digest"], None)]
    records = client.get(f"/v1/instances/{iid}/records").json()
    assert [r for r in records if r["kind"] == "approval" and r["data"].get("decision")] == []
    assert [r["data"]["status"] for r in records if r["kind"] == "tool_call" and r["data"].get("status")] == []
    # The digest shown is what runs: with it, the call is decided.
    decided = client.post(f"/v1/instances/{iid}/approvals/{call}", json={"decision": "deny",
                                                                          "digest": pending["digest"]})
    assert decided.status_code == 200, decided.text
    assert decided.json()["decided"][0]["digest"] == pending["digest"]


def test_a_row_damaged_in_the_store_is_a_409_that_says_so_never_a_500(client: httpx.Client, assembly: Path) -> None:
    """An instance held in the store (not live in the server) whose entry log another writer broke.

    Deciding it loads it, which fails closed: a 409 "Cannot run" naming the instance, nothing decided.
    """
    held = cli(assembly, "--json", "run", "approve", "-p", "delete it")
    assert held.returncode == 3, held.stderr
    iid = json.loads(held.stdout)["instanceId"]
    (pending,) = client.get(f"/v1/instances/{iid}").json()["pendingApprovals"]
    log = assembly.parent / "store" / iid / "entries.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join([lines[0], "not json {\n", *lines[1:]]))  # inside the log: no torn last write
    refused = client.post(f"/v1/instances/{iid}/approvals/{pending['toolCallId']}",
                          json={"decision": "approve", "digest": pending["digest"]})
    assert refused.status_code == 409, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    problem = refused.json()
    assert (problem["title"], problem["instanceId"]) == ("Cannot run", iid)
    assert "entry log cannot be replayed" in problem["detail"], problem
    assert client.get(f"/v1/instances/{iid}").json()["pendingApprovals"][0]["decision"] is None


def test_deny_with_a_reason(client: httpx.Client) -> None:
    iid = start(client, "approve")["instanceId"]
    (pending,) = wait_rest(client, iid, "waiting_for_approval")["pendingApprovals"]
    response = client.post(f"/v1/instances/{iid}/approvals/{pending['toolCallId']}",
                           json={"decision": "deny", "reason": "not that file", "digest": pending["digest"]})
    assert response.status_code == 200
    assert response.json()["decided"][0]["decisionReason"] == "not that file"
    wait_rest(client, iid, "waiting")
    tool_calls = client.get(f"/v1/instances/{iid}/records", params={"kind": "tool_call"}).json()
    assert tool_calls[-1]["data"]["status"] == "denied"


def test_unknown_call_and_unknown_instance(client: httpx.Client) -> None:
    iid = start(client, "approve")["instanceId"]
    wait_rest(client, iid, "waiting_for_approval")
    response = client.post(f"/v1/instances/{iid}/approvals/call_nope", json={"decision": "approve",
                                                                              "digest": "0" * 64})
    assert response.status_code == 409
    assert "call_nope" in response.json()["detail"]
    for path in ("/v1/instances/20990101-000000-deadbeef", "/v1/instances/20990101-000000-deadbeef/records",
                 "/v1/instances/20990101-000000-deadbeef/events"):
        missing = client.get(path)
        assert missing.status_code == 404, path
        assert missing.json()["status"] == 404
    gone = client.post("/v1/instances/20990101-000000-deadbeef/messages", json={"text": "hi"})
    assert gone.status_code == 404
    # An id that cannot be one is a 400 stating the rule, on every path under /v1/instances/ (never looked up);
    # "a%2Fb" is the id "a/b", and "ID%2Fevents" not the events of ID.
    for path in ("/v1/instances/-rf", "/v1/instances/.hidden/records", "/v1/instances/%2E/events",
                 "/v1/instances/a%2Fb", f"/v1/instances/{iid}%2Fevents", "/v1/instances/--help/nothing"):
        refused = client.get(path)
        assert refused.status_code == 400, path
        assert refused.headers["content-type"] == "application/problem+json"
        assert (refused.json()["title"], refused.json()["status"]) == ("Invalid instance id", 400)
        assert INSTANCE_ID_RULE in refused.json()["detail"]
    # A valid id is left to the router: an unknown route, a method the route lacks.
    assert client.get(f"/v1/instances/{iid}/nothing").status_code == 404
    assert client.post(f"/v1/instances/{iid}", json={}).status_code == 405


def test_message_starts_the_next_segment(client: httpx.Client) -> None:
    iid = start(client, "chat", prompt="first")["instanceId"]
    wait_rest(client, iid, "waiting")
    response = client.post(f"/v1/instances/{iid}/messages", json={"text": "second"})
    assert response.status_code == 202
    assert response.json()["delivered"] is True
    events = read_events(client, iid, lambda e: e.event == "transcript" and e.data["message"]["role"] == "assistant"
                         and "second" in (e.data["message"].get("content") or ""))
    assert events[-1].data["message"]["content"] == "you said: second"


def test_cancel_a_running_instance(client: httpx.Client, assembly: Path) -> None:
    iid = start(client, "slow")["instanceId"]
    read_events(client, iid, lambda e: e.event == "transcript" and bool(e.data["message"].get("toolCalls")))
    response = client.post(f"/v1/instances/{iid}/cancel")
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "stopped"
    assert response.json()["cancelled"] is True


def test_records_filters(client: httpx.Client) -> None:
    iid = start(client, "done")["instanceId"]
    wait_rest(client, iid)
    records = client.get(f"/v1/instances/{iid}/records").json()
    assert records[0]["kind"] == "state"
    assert client.get(f"/v1/instances/{iid}/records", params={"after": 1}).json() == records[1:]
    assert {r["kind"] for r in client.get(f"/v1/instances/{iid}/records", params={"kind": "turn"}).json()} == {"turn"}
    assert client.get(f"/v1/instances/{iid}/records", params={"after": "-1"}).status_code == 422


def test_bad_bodies_get_problem_documents(client: httpx.Client) -> None:
    cases = [
        (b'{"definition": ', "application/json", 400),
        (b'{"definition": "chat", "colour": "blue"}', "application/json", 422),
        (b'{"definition": 3}', "application/json", 422),
        (b'{"prompt": "no definition"}', "application/json", 422),
        (b'{"definition": "chat"}', "text/plain", 415),
        (b'{"definition": "chat", "inputs": {"x": NaN}}', "application/json", 400),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    ]
    for body, kind, status in cases:
        response = client.post("/v1/instances", content=body, headers={"content-type": kind})
        assert response.status_code == status, (body[:60], response.text)
        problem = response.json()
        assert response.headers["content-type"] == "application/problem+json"
        assert problem["status"] == status
        assert problem["title"]
    decision = client.post("/v1/instances/x/approvals/y", json={"decision": "maybe", "digest": "0" * 64})
    assert decision.status_code == 422
    assert decision.json()["errors"][0]["path"] == "$.decision"
    # A decision without the digest of the call it saw is refused before anything is looked up.
    blind = client.post("/v1/instances/x/approvals/y", json={"decision": "approve"})
    assert blind.status_code == 422
    assert "digest" in json.dumps(blind.json()["errors"])
    assert client.get("/healthz").status_code == 200


def test_sse_resumes_with_last_event_id_across_processes(client: httpx.Client, assembly: Path) -> None:
    """An instance run by the CLI in other processes; the server's stream resumes where the client left."""
    ran = cli(assembly, "run", "approve", "-p", "from the terminal", "--json")
    assert ran.returncode == 3, ran.stderr
    iid = json.loads(ran.stdout)["instanceId"]
    first = read_events(client, iid, rests_in("waiting_for_approval"))
    last_id = first[-1].id
    # Decided and run on by another process while no client listens.
    approved = cli(assembly, "approve", iid, "--json")
    assert approved.returncode == 0, approved.stderr
    rest = read_events(client, iid, rests_in("waiting"), last_event_id=last_id)
    seen = [e.id for e in first]
    assert not set(seen) & {e.id for e in rest}, "an event came twice"
    assert rest[0].event == "record" or rest[0].data["index"] > first[-1].data.get("index", -1)
    kinds = [e.data["kind"] for e in rest if e.event == "record"]
    assert "tool_call" in kinds
    assert any(e.event == "transcript" and e.data["message"]["role"] == "tool" for e in rest)
    # The whole stream again from the start holds the same events as the two halves, none lost.
    whole = read_events(client, iid, rests_in("waiting"))

    def contents(events: list) -> list[str]:
        return sorted(json.dumps([e.event, e.data], sort_keys=True) for e in events)

    assert contents(whole) == contents(first + rest)
    for events in (first, rest, whole):  # each id is at or past the one before, in both logs
        places = [tuple(int(n) for n in e.id.split("-")) for e in events]
        assert all(a[0] <= b[0] and a[1] <= b[1] and a != b for a, b in itertools.pairwise(places))
    assert client.get(f"/v1/instances/{iid}/events", headers={"Last-Event-ID": "banana"}).status_code == 400


def no_streams_open(client: httpx.Client) -> None:
    deadline = time.monotonic() + 30
    while client.get("/healthz").json()["eventStreams"]:
        assert time.monotonic() < deadline, "a closed stream's place was never given back"
        time.sleep(0.05)


def test_event_streams_are_bounded_and_end_at_shutdown(tmp_path: Path) -> None:
    assembly = project(tmp_path, "  maxEventStreams: 1\n")
    with serving(assembly) as server, server.client() as client:
        iid = start(client, "chat")["instanceId"]
        with client.stream("GET", f"/v1/instances/{iid}/events") as open_stream:
            assert open_stream.status_code == 200
            refused = client.get(f"/v1/instances/{iid}/events")
            assert refused.status_code == 503
            assert refused.headers["retry-after"]
        # Closed: the place is given back once the server has seen the client leave.
        no_streams_open(client)
        read_events(client, iid, rests_in("waiting"))
        no_streams_open(client)
        with client.stream("GET", f"/v1/instances/{iid}/events") as held:
            assert held.status_code == 200
            server.process.terminate()
            # The server ends the stream itself and exits cleanly.
            list(held.iter_raw())
        assert server.process.wait(timeout=60) == 0


def test_run_false_only_writes_the_work_and_workers_run_it(tmp_path: Path) -> None:
    """With server.run false nothing runs in the server: `loopwright worker` processes do the work it writes."""
    assembly = project(tmp_path, "  run: false\n")
    with serving(assembly) as server, server.client() as client:
        created = start(client, "approve", prompt="queued")
        iid = created["instanceId"]
        assert created["state"] == "running"
        assert created["queued"] is True
        # Nobody runs it until a worker does.
        assert client.get(f"/v1/instances/{iid}/records").json() == []
        worker = cli(assembly, "worker", "--once", "--poll", "100ms")
        assert worker.returncode == 0, worker.stderr
        shown = client.get(f"/v1/instances/{iid}").json()
        assert shown["state"] == "waiting_for_approval"
        (pending,) = shown["pendingApprovals"]
        # A stale digest is refused here too, before anything is saved for a worker.
        stale = client.post(f"/v1/instances/{iid}/approvals/{pending['toolCallId']}",
                            json={"decision": "approve", "digest": "f" * 64})
        assert stale.status_code == 409, stale.text
        assert stale.json()["currentDigest"] == pending["digest"]
        assert client.get(f"/v1/instances/{iid}").json()["pendingApprovals"][0]["decision"] is None
        decided = client.post(f"/v1/instances/{iid}/approvals/{pending['toolCallId']}",
                              json={"decision": "approve", "digest": pending["digest"]})
        assert decided.status_code == 200, decided.text
        assert decided.json()["decided"][0]["decidedBy"] == "local"
        # Saved, not continued here: the call waits, decided, for a worker.
        assert client.get(f"/v1/instances/{iid}").json()["state"] == "waiting_for_approval"
        worker = cli(assembly, "worker", "--once", "--poll", "100ms")
        assert worker.returncode == 0, worker.stderr
        assert client.get(f"/v1/instances/{iid}").json()["state"] == "waiting"
        approvals = client.get(f"/v1/instances/{iid}/records", params={"kind": "approval"}).json()
        assert approvals[-1]["data"]["by"] == "local"
        # A message goes to the mailbox; the next worker reads it.
        assert client.post(f"/v1/instances/{iid}/messages", json={"text": "more"}).status_code == 202
        assert client.get(f"/v1/instances/{iid}").json()["state"] == "waiting"
        worker = cli(assembly, "worker", "--once", "--poll", "100ms")
        assert worker.returncode == 0, worker.stderr
        transcript = read_events(client, iid, lambda e: e.event == "transcript"
                                 and e.data["message"].get("content") == "result: more")
        assert transcript[-1].data["message"]["role"] == "assistant"


def test_definitions_list_each_registered_agent_with_its_inputs_schema(client: httpx.Client) -> None:
    listed = {d["name"]: d for d in client.get("/v1/definitions").json()}
    assert "inputs" in listed
    assert "chat" in listed
    schema = listed["inputs"]["inputs"]
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["properties"]["count"] == {"type": "integer"}
    assert schema["properties"]["flag"] == {"type": "boolean"}
    assert sorted(schema["required"]) == ["count", "flag", "name", "notes"]
    assert listed["approve"]["tools"] == ["delete"]
    assert listed["chat"]["inputs"] == {"type": "object", "properties": {}, "required": [],
                                        "additionalProperties": False}


def test_the_list_filters_by_text_and_pages_with_a_total(client: httpx.Client) -> None:
    ids = [start(client, "done", prompt=f"page-marker-{k}")["instanceId"] for k in range(3)]
    for iid in ids:
        wait_rest(client, iid)
    found = client.get("/v1/instances", params={"q": "PAGE-MARKER"})
    assert found.status_code == 200
    assert [s["instanceId"] for s in found.json()] == ids  # the task prompt matches, in any case
    assert found.headers["x-total-count"] == "3"
    second = client.get("/v1/instances", params={"q": "page-marker", "limit": 2, "offset": 2})
    assert [s["instanceId"] for s in second.json()] == ids[2:]
    assert second.headers["x-total-count"] == "3"
    newest = client.get("/v1/instances", params={"q": "page-marker", "order": "newest", "limit": 1})
    assert [s["instanceId"] for s in newest.json()] == ids[2:]
    assert client.get("/v1/instances", params={"order": "random"}).status_code == 422
    assert client.get("/v1/instances", params={"q": ids[1][-8:]}).json()[0]["instanceId"] == ids[1]
    trees = client.get("/v1/instances", params={"q": "page-marker-1", "tree": "true"}).json()
    assert [n["instanceId"] for n in trees] == [ids[1]]
    for bad in ({"limit": "0"}, {"limit": "501"}, {"offset": "-1"}, {"q": "x" * 201}):
        assert client.get("/v1/instances", params=bad).status_code == 422, bad
    # Without live=true the summaries stay ls --json's; with it they carry the live counters.
    assert "live" not in found.json()[0]
    dressed = client.get("/v1/instances", params={"q": ids[0], "live": "true"}).json()[0]
    assert dressed["live"]["turns"] == 1
    assert dressed["live"]["usage"]["totalTokens"] == dressed["usage"]["totalTokens"]
    assert dressed["question"] is None


def test_live_numbers_count_the_turns_a_running_instance_wrote(client: httpx.Client) -> None:
    """The header's counters are written at rest: while the slow tool runs, live counts the model's answer."""
    iid = start(client, "slow")["instanceId"]
    (*_, answer) = read_events(client, iid, lambda e: e.event == "transcript" and "turn" in e.data)
    turn = answer.data["turn"]
    shown = client.get(f"/v1/instances/{iid}", params={"live": "true"}).json()
    assert shown["state"] == "running"
    assert shown["usage"]["totalTokens"] == 0  # the header's, as of its last rest
    assert shown["live"]["turns"] == 1
    assert shown["live"]["usage"]["totalTokens"] == turn["usage"]["totalTokens"] > 0
    assert shown["live"]["cost"] == turn["cost"]
    assert shown["live"]["runningSince"]
    node = next(n for n in client.get("/v1/instances", params={"tree": "true", "live": "true"}).json()
                if n["instanceId"] == iid)
    assert node["live"] == shown["live"]
    assert client.post(f"/v1/instances/{iid}/cancel").status_code == 200


def test_fork_and_rewind_at_a_turn(client: httpx.Client) -> None:
    iid = start(client, "chat", prompt="hello")["instanceId"]
    wait_rest(client, iid, "waiting")
    response = client.post(f"/v1/instances/{iid}/fork", json={"turn": 1})
    assert response.status_code == 201, response.text
    fork = response.json()
    assert response.headers["location"] == f"/v1/instances/{fork['instanceId']}"
    assert fork["state"] == "waiting"
    shown = client.get(f"/v1/instances/{fork['instanceId']}", params={"live": "true"}).json()
    assert shown["forkedFrom"] == {"instanceId": iid, "turn": 1}
    marks = client.get(f"/v1/instances/{iid}/records", params={"kind": "fork"}).json()
    assert [m["data"]["to"] for m in marks] == [fork["instanceId"]]
    rewound = client.post(f"/v1/instances/{iid}/rewind", json={"turn": 0})
    assert rewound.status_code == 200, rewound.text
    assert [r["data"]["to"] for r in client.get(f"/v1/instances/{iid}/records",
                                                params={"kind": "rewind"}).json()] == [0]
    beyond = client.post(f"/v1/instances/{iid}/rewind", json={"turn": 99})
    assert beyond.status_code == 409
    assert "not in its history" in beyond.json()["detail"]
    assert client.post(f"/v1/instances/{iid}/fork", json={"turn": -1}).status_code == 422
    assert client.post(f"/v1/instances/{iid}/rewind", json={}).status_code == 422


def test_a_thread_is_put_then_continued_then_deleted(client: httpx.Client, assembly: Path) -> None:
    """PUT /v1/instances/ID starts the thread ID (201), then sends it messages (202); DELETE removes it (issue 29)."""
    first = client.put("/v1/instances/thread-7", json={"definition": "chat", "text": "first"})
    assert first.status_code == 201, first.text
    assert first.headers["location"] == "/v1/instances/thread-7"
    assert first.json()["instanceId"] == "thread-7"
    wait_rest(client, "thread-7", "waiting")
    again = client.put("/v1/instances/thread-7", json={"definition": "chat", "text": "second"})
    assert again.status_code == 202, again.text
    events = read_events(client, "thread-7", lambda e: e.event == "transcript"
                         and e.data["message"]["role"] == "assistant"
                         and "second" in (e.data["message"].get("content") or ""))
    assert events[-1].data["message"]["content"] == "you said: second"
    said = [e.data["message"]["content"] for e in events if e.data["message"]["role"] == "user"]
    assert said == ["first", "second"]
    other = client.put("/v1/instances/thread-7", json={"definition": "done", "text": "x"})
    assert other.status_code == 422
    assert "is an instance of" in other.json()["detail"]
    wait_rest(client, "thread-7", "waiting")
    gone = client.delete("/v1/instances/thread-7")
    assert gone.status_code == 200, gone.text
    assert gone.json() == {"deleted": ["thread-7"]}
    assert client.get("/v1/instances/thread-7").status_code == 404
    assert client.delete("/v1/instances/thread-7").status_code == 404
    assert not (assembly.parent / "store" / "thread-7").exists()
    for bad in ("-rf", "..", ".hidden"):
        refused = client.put(f"/v1/instances/{bad}", json={"definition": "chat", "text": "x"})
        assert refused.status_code in {400, 404}, (bad, refused.status_code)
    assert client.put("/v1/instances/t8", json={"definition": "no-such", "text": "x"}).status_code == 422
    assert client.get("/v1/instances/t8").status_code == 404


def test_delete_of_a_running_instance_is_a_409_and_deletes_nothing(client: httpx.Client, assembly: Path) -> None:
    iid = start(client, "slow", prompt="go")["instanceId"]
    refused = client.delete(f"/v1/instances/{iid}")
    assert refused.status_code == 409, refused.text
    assert "cancel it" in refused.json()["detail"]
    assert (assembly.parent / "store" / iid).is_dir()
    client.post(f"/v1/instances/{iid}/cancel", json={})
    wait_rest(client, iid, "stopped")
    assert client.delete(f"/v1/instances/{iid}").status_code == 200
