"""A site's status as Prometheus metrics: the text exposition format, version 0.0.4.

Pure functions, no I/O: :func:`render` takes the document ``syncpack --json status`` prints
(:func:`syncpack.admin.inspection.status`) and, for a batch round, a :class:`BatchRound`, and returns the
text that ``syncpack status --format prometheus`` prints and that the batch key ``metrics``
writes for node_exporter's textfile collector.

Every sample carries a ``site`` label, so several sites on one host can each write a file into
the same textfile directory without their series colliding (node_exporter refuses duplicate
series).  Per-peer metrics add a ``peer`` label.  Label values are escaped as the format
requires (backslash, double quote, line feed), since site names may hold any of them.

Times are Unix timestamps in seconds (``..._timestamp_seconds``), not "seconds since":
node_exporter reads the file whenever Prometheus scrapes, possibly long after it was written, so
an age computed at writing time would freeze and understate exactly the staleness an alert has
to catch.  A timestamp stays true; the rule computes the age with ``time() - metric``.  A peer
that never sent (or was never sent) a packet reads 0, i.e. infinitely old.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4"

# name, type, help: one entry per metric family, in output order.
FAMILIES: list[tuple[str, str, str]] = [
    ("syncpack_site_info", "gauge",
     "Always 1; labels name the site and its family."),
    ("syncpack_recovering", "gauge",
     "1 while the site is recovering after a restore from backup (local writes refused), "
     "else 0."),
    ("syncpack_retired", "gauge",
     "1 if a member's write retired this site (its packets are refused where that is known; "
     "'syncpack status' says who), else 0."),
    ("syncpack_retired_members", "gauge",
     "Members retired from the family ('syncpack status' says who retired each)."),
    ("syncpack_clock_stamps_ahead_seconds", "gauge",
     "How far this site's newest change stamp lies ahead of its clock; past a day (its clock "
     "ran fast when it wrote) peers refuse its packets until the clock catches up."),
    ("syncpack_changelog_ops", "gauge",
     "Ops held in the site's changelog (what scrub can trim once every member acknowledged)."),
    ("syncpack_parked_packets", "gauge",
     "Packets kept at the site that wait for earlier packets before they can apply."),
    ("syncpack_conflicts", "gauge",
     "Keys that 'syncpack conflicts' lists: concurrent writes to resolve, and records the local "
     "schema refused or that wait for a column."),
    ("syncpack_forks_open", "gauge",
     "Members frozen here because they signed two histories (open fork evidence)."),
    ("syncpack_fork", "gauge",
     "Always 1 per piece of fork evidence; labels name the origin, the fork epoch and the "
     "state (open: frozen here; healed; ended)."),
    ("syncpack_peer_lag_ops", "gauge",
     "Ops this site holds that the peer is not known to hold (as the peer's acknowledgements "
     "and this site's packets tell)."),
    ("syncpack_peer_unacked_ops", "gauge",
     "Ops sent to the peer that it has not acknowledged yet."),
    ("syncpack_peer_last_packet_received_timestamp_seconds", "gauge",
     "Unix time this site last took in a packet from the peer (applied or parked); "
     "0 if never."),
    ("syncpack_peer_last_packet_sent_timestamp_seconds", "gauge",
     "Unix time this site last wrote a packet for the peer; 0 if never."),
    ("syncpack_attached_pending_changes", "gauge",
     "Changes the attached application committed to the table that are not yet captured "
     "into the changelog."),
    ("syncpack_attached_rows", "gauge",
     "Rows in the attached application table."),
    ("syncpack_attached_stopped", "gauge",
     "1 while capture of the attached table is stopped by a schema change peers cannot "
     "follow (see 'syncpack attached'), else 0."),
    ("syncpack_attached_waiting_records", "gauge",
     "Records that wait for a column the attached table lacks."),
    ("syncpack_attached_records_to_apply", "gauge",
     "Keys of the attached table whose visible record is not yet written into it (waiting "
     "records and clashes included)."),
    ("syncpack_attached_database_unreadable", "gauge",
     "1 while the attached application database cannot be opened or read (see 'syncpack "
     "attached'), else 0; absent when nothing is attached."),
    ("syncpack_attached_failing", "gauge",
     "1 while capturing from or writing into the attached application database fails (the "
     "error is in 'syncpack attached'), else 0; absent when nothing is attached."),
    ("syncpack_attached_behind", "gauge",
     "1 while the attached application database (side=\"file\") or the store "
     "(side=\"store\") is behind the other, restored from an older copy (see 'syncpack "
     "attached'), else 0; absent when nothing is attached."),
    ("syncpack_batch_last_run_timestamp_seconds", "gauge",
     "Unix time the last batch round ended."),
    ("syncpack_batch_last_run_ok", "gauge",
     "1 if every action of the last batch round succeeded and no packet was rejected, else 0."),
    ("syncpack_batch_last_run_duration_seconds", "gauge",
     "How long the last batch round took."),
    ("syncpack_batch_last_run_failed_actions", "gauge",
     "Actions (imports, exports, scrub, metrics) of the last batch round that failed."),
    ("syncpack_batch_last_run_packets", "gauge",
     "Packets the last batch round handled, by result."),
    ("syncpack_batch_last_success_timestamp_seconds", "gauge",
     "Unix time the last fully successful batch round ended (carried over from the previous "
     "file while rounds fail)."),
]
_TYPE = {n: t for n, t, _ in FAMILIES}

PACKET_RESULTS = ("applied", "duplicate", "parked", "rejected", "skipped", "removed",
                  "exported")


@dataclass
class BatchRound:
    """What a batch round adds to the site's metrics."""

    finished_s: float
    duration_s: float
    ok: bool
    failed_actions: int
    packets: dict[str, int] = field(default_factory=dict)   # PACKET_RESULTS -> count
    last_success_s: float | None = None                     # None: no successful round known


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(v: float | int | bool) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _seconds(ms: int | None) -> float | int:
    return 0 if not ms else ms / 1000


def samples(status: dict, batch: BatchRound | None = None) \
        -> dict[str, list[tuple[dict[str, str], float | int]]]:
    """Metric name -> [(labels, value)], in the order of :data:`FAMILIES`.

    ``status`` may hold only ``site`` and ``family``: then only the info metric and the batch
    round's metrics are given."""
    site = {"site": status["site"]}
    out: dict[str, list] = {n: [] for n, _, _ in FAMILIES}
    out["syncpack_site_info"].append(({**site, "family": status.get("family") or ""}, 1))
    if "state" in status:   # absent when a batch round could not read the store
        out["syncpack_recovering"].append((site, int(status["state"] == "recovering")))
        retired = [r["site"] for r in status.get("retired", [])]
        out["syncpack_retired"].append((site, int(status["site"] in retired)))
        out["syncpack_retired_members"].append((site, len(retired)))
        out["syncpack_clock_stamps_ahead_seconds"].append(
            (site, _seconds(status.get("stamps_ahead_ms"))))
        out["syncpack_changelog_ops"].append((site, status["changelog_ops"]))
        out["syncpack_parked_packets"].append((site, len(status["parked"])))
        out["syncpack_conflicts"].append((site, status["conflicts"]))
        out["syncpack_forks_open"].append(
            (site, sum(f["state"] == "open" for f in status.get("forks", []))))
    for f in status.get("forks", []):
        out["syncpack_fork"].append(({**site, "origin": f["origin"], "epoch": str(f["epoch"]),
                                       "state": f["state"]}, 1))
    for peer, d in status.get("peers", {}).items():
        lab = {**site, "peer": peer}
        out["syncpack_peer_lag_ops"].append((lab, d["lag_ops"]))
        out["syncpack_peer_unacked_ops"].append((lab, d["unacknowledged_ops"]))
        out["syncpack_peer_last_packet_received_timestamp_seconds"].append(
            (lab, _seconds(d.get("last_received_ms"))))
        out["syncpack_peer_last_packet_sent_timestamp_seconds"].append(
            (lab, _seconds(d.get("last_sent_ms"))))
    for t in (status.get("attached") or {}).get("tables", []):
        lab = {**site, "table": t["table"]}
        if t.get("pending") is not None:
            out["syncpack_attached_pending_changes"].append((lab, t["pending"]))
        if t.get("rows") is not None:
            out["syncpack_attached_rows"].append((lab, t["rows"]))
        out["syncpack_attached_stopped"].append((lab, int(bool(t.get("stopped")))))
        out["syncpack_attached_waiting_records"].append((lab, t.get("waiting", 0)))
        out["syncpack_attached_records_to_apply"].append((lab, t.get("to_apply", 0)))
    att = status.get("attached") or {}
    if att.get("database"):
        out["syncpack_attached_database_unreadable"].append((site, int(bool(att.get("problem")))))
        out["syncpack_attached_failing"].append((site, int(bool(att.get("failing")))))
        for side in ("file", "store"):
            out["syncpack_attached_behind"].append(
                ({**site, "side": side}, int(bool(att.get(f"{side}_behind")))))
    if batch is not None:
        out["syncpack_batch_last_run_timestamp_seconds"].append((site, batch.finished_s))
        out["syncpack_batch_last_run_ok"].append((site, int(batch.ok)))
        out["syncpack_batch_last_run_duration_seconds"].append((site, batch.duration_s))
        out["syncpack_batch_last_run_failed_actions"].append((site, batch.failed_actions))
        for result in PACKET_RESULTS:
            out["syncpack_batch_last_run_packets"].append(
                ({**site, "result": result}, batch.packets.get(result, 0)))
        if batch.last_success_s is not None:
            out["syncpack_batch_last_success_timestamp_seconds"].append(
                (site, batch.last_success_s))
    return out


def render(status: dict, batch: BatchRound | None = None) -> str:
    """The text exposition format: per family a HELP and a TYPE line, then its samples.

    Families without samples (no peers yet, no batch round) are left out whole."""
    helps = {n: h for n, _, h in FAMILIES}
    lines: list[str] = []
    for name, rows in samples(status, batch).items():
        if not rows:
            continue
        lines.append(f"# HELP {name} {_escape_help(helps[name])}")
        lines.append(f"# TYPE {name} {_TYPE[name]}")
        for labels, value in rows:
            lab = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {format_value(value)}")
    return "\n".join(lines) + "\n"


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+"
                     r"(?P<value>\S+)(?:\s+\S+)?$")


def previous_value(text: str, name: str, site: str) -> float | None:
    """The value of ``name{site=SITE}`` in a file :func:`render` wrote earlier, or None.

    A batch round reads the previous file to carry the last success time across failed
    rounds; anything unreadable counts as absent (the metric is then simply not written)."""
    want = f'site="{escape_label(site)}"'
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m["name"] != name or want not in (m["labels"] or ""):
            continue
        try:
            v = float(m["value"])
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    return None
