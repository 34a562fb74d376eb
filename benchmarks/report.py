"""Turns the figures of benchmarks/bench.py into docs/benchmarks.md, its PNG plots and
docs/benchmarks.json. Every number in the page comes from the run that writes it.

    python benchmarks/report.py [docs/benchmarks.json]   # re-draw page and plots, no new run
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from assetq import migrate

ENGINE_TITLES = {"postgresql": "PostgreSQL", "mysql": "MariaDB"}
PLOTS = "benchmarks"  # folder of the PNGs, next to benchmarks.md

#: Airflow 3's published figure for one asset-triggered run of 50,000 events on PostgreSQL
#: (apache/airflow#69848).
AIRFLOW_50K_SECONDS = 10.0

#: Figures measured before 0.1.0 name the development schema they ran at, as bench.py wrote
#: it ("0.1.0 (schema 0007_capped_claim)"). Those revisions are gone: the 0.1.0 baseline
#: installs the tables and routines of the last of them, unchanged (CHANGELOG, 0.1.0).
_AT_SCHEMA = re.compile(r"^(?P<version>\S+) \(schema (?P<revision>\w+)\)$")
BASELINE_OF = "0015_batch_lookups"

#: Labels of variants that benchmarks/peers.py has renamed since a figure was stored: the
#: page shows today's label.
RENAMED = {"without 0007's two queue indexes": "without the capped claim's two queue indexes"}


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _spread(values: Sequence[float], scale: float = 1.0, digits: int = 0, unit: str = "") -> str:
    """Median with min-max: ``1.38x (1.28-2.19)``."""
    fmt = f"{{:,.{digits}f}}"
    med, low, high = _median(values) * scale, min(values) * scale, max(values) * scale
    if len(values) == 1:
        return fmt.format(med) + unit
    return f"{fmt.format(med)}{unit} ({fmt.format(low)}-{fmt.format(high)})"


def _ratios(top: Sequence[float], bottom: Sequence[float]) -> list[float]:
    """Per-repetition ratios: the two rounds of a repetition ran next to each other."""
    return [a / b for a, b in zip(top, bottom, strict=True) if b]


def _assetq(version: str) -> str:
    """The assetq version and schema of a figure, as the page says it: one measured at a
    development revision says what 0.1.0 installs of it."""
    match = _AT_SCHEMA.match(version)
    if match is None or match["revision"] not in migrate.DEVELOPMENT_REVISIONS:
        return version
    at = f"{match['version']}, measured at development schema {match['revision']}"
    if match["revision"] == BASELINE_OF:
        return f"{at}, whose tables and routines the 0.1.0 baseline installs unchanged"
    return (
        f"{at} (the 0.1.0 baseline installs the tables and routines of development schema"
        f" {BASELINE_OF}; these figures were not measured again at it)"
    )


def _engine_title(report: dict[str, Any], engine: str) -> str:
    title = ENGINE_TITLES.get(engine, engine)
    settings = report["engines"][engine].get("settings", {})
    version = settings.get("server_version") or settings.get("version", "")
    return f"{title} {(version.split() or [''])[0].split('-')[0]}".strip()


# -- targets ---------------------------------------------------------------------------------


def targets_summary(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured figure per engine and whether it is met."""
    rows: list[dict[str, Any]] = []
    for engine, data in report["engines"].items():
        title = ENGINE_TITLES.get(engine, engine)
        reg = data.get("registration")
        if reg:
            rates = reg["rates"]
            single_target = 1.3 if engine == "postgresql" else 0.9
            cells = [("", rates, t) for t in reg["threads"]]
            cells += (
                [(", durable commits", reg["durable_rates"], 1)] if "durable_rates" in reg else []
            )
            for suffix, table, threads in cells:
                t = str(threads)
                own = table["assetq (own transaction)"][t]
                in_tx = table["assetq in BEGIN/COMMIT"][t]
                plain = table["plain statements"][t]
                airflow = table["Airflow-style path"][t]
                for label, top, bottom, target in (
                    ("single registration / plain statements", own, plain, single_target),
                    ("same, with assetq inside BEGIN/COMMIT", in_tx, plain, single_target),
                    ("single registration / Airflow-style path", own, airflow, 5.0),
                ):
                    ratios = _ratios(top, bottom)
                    rows.append(
                        {
                            "engine": title,
                            "target": f"{label}, {threads} thread{'s' if threads > 1 else ''}"
                            f"{suffix} >= {target:g}x",
                            "measured": _spread(ratios, digits=2, unit="x"),
                            "met": _median(ratios) >= target,
                        }
                    )
        batch = data.get("batch")
        if batch:
            labels = list(batch["rates"])
            batched, own, one_tx = (batch["rates"][k] for k in labels)
            for label, bottom in (
                ("batch / single calls each in its own transaction", own),
                ("batch / single calls in one transaction", one_tx),
            ):
                ratios = _ratios(batched, bottom)
                rows.append(
                    {
                        "engine": title,
                        "target": f"{label} >= 10x",
                        "measured": _spread(ratios, digits=1, unit="x"),
                        "met": _median(ratios) >= 10,
                    }
                )
        passes = data.get("pass")
        if passes and len(passes["history"]) > 1:
            low, high = str(min(passes["history"])), str(max(passes["history"]))
            ratios = _ratios(passes["assetq"][high], passes["assetq"][low])
            rows.append(
                {
                    "engine": title,
                    "target": f"pass at {int(high):,} / at {int(low):,} events of history <= 1.3x",
                    "measured": _spread(ratios, digits=2, unit="x"),
                    "met": _median(ratios) <= 1.3,
                }
            )
        run = data.get("large_run")
        if run:
            sizes = [int(s) for s in run["sizes"]]
            big, small = str(max(sizes)), str(min(sizes))
            seconds = _median(run["seconds"][big])
            rows.append(
                {
                    "engine": title,
                    "target": f"one run of {int(big):,} events: >= 10x faster than Airflow's"
                    f" {AIRFLOW_50K_SECONDS:g} s",
                    "measured": f"{seconds * 1000:,.0f} ms ({AIRFLOW_50K_SECONDS / seconds:,.0f}x)",
                    "met": AIRFLOW_50K_SECONDS / seconds >= 10,
                }
            )
            per_event = (_median(run["peak_bytes"][big]) - _median(run["peak_bytes"][small])) / (
                int(big) - int(small)
            )
            rows.append(
                {
                    "engine": title,
                    "target": "flat Python memory: the peak grows by the run's ids only"
                    " (< 200 B/event)",
                    "measured": f"{_median(run['peak_bytes'][big]) / 1e6:.1f} MB at {int(big):,}"
                    f" events, {per_event:.0f} B/event",
                    "met": per_event < 200,
                }
            )
        burn = data.get("burndown")
        if burn:
            rows += _burndown_targets(title, burn)
        peer_figures = data.get("peers")
        if peer_figures:
            rows += _peer_targets(title, peer_figures)
    return rows


# -- against the peers (benchmarks/peers.py) -------------------------------------------------

P_ASSETQ, P_API, P_ONE = "assetq", "assetq (Python API)", "assetq, limit 1"
P_PGQ, P_PGMQ, P_PROC, P_PLAIN = "PgQ", "pgmq", "procrastinate", "plain statements"
P_PEERS = (P_PGQ, P_PGMQ, P_PROC)


def _peer_rows(
    peer_figures: dict[str, Any],
) -> list[tuple[str, dict[str, list[float]], dict[str, float]]]:
    """The works of the peers figure: (what, events/s per side per repetition, the issue's
    targets for assetq / peer)."""
    rows: list[tuple[str, dict[str, list[float]], dict[str, float]]] = []
    if not peer_figures:
        return rows
    st = peer_figures["settings"]
    for key, rates in peer_figures.get("producer", {}).items():
        consumers, clients = (int(x) for x in key.split("/"))
        targets: dict[str, float] = {}
        if consumers == 4:
            targets = {P_PGQ: 0.7 if clients == 1 else 0.9}
        rows.append(
            (
                f"producer, 1 event per transaction, {consumers} consumer"
                f"{'s' if consumers > 1 else ''}, {clients} client{'s' if clients > 1 else ''}",
                rates,
                targets,
            )
        )
    if "batch" in peer_figures:
        rows.append(
            (
                f"batch of {st['batch_size']:,} events, {st['batch_consumers']} consumers",
                peer_figures["batch"],
                {P_PGQ: 0.5},
            )
        )
    drain = peer_figures.get("drain", {})
    if "whole" in drain:
        rows.append(
            (
                f"drain a {drain['backlog']:,} backlog, whole queue in one run",
                drain["whole"],
                {P_PGQ: 0.5},
            )
        )
    for cap, targets in (("1000", {P_PGMQ: 1.0, P_PGQ: 0.3}), ("1", {P_PROC: 1.0})):
        if cap in drain:
            rows.append(
                (
                    f"drain, {int(cap):,} event{'s' if cap != '1' else ''} per run",
                    drain[cap],
                    targets,
                )
            )
    return rows


def _peer_targets(title: str, peer_figures: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for what, rates, targets in _peer_rows(peer_figures):
        for peer, target in targets.items():
            if peer not in rates or P_ASSETQ not in rates:
                continue
            ratios = _ratios(rates[P_ASSETQ], rates[peer])
            rows.append(
                {
                    "engine": title,
                    "target": f"{what}: assetq / {peer} >= {target:g}x",
                    "measured": _spread(ratios, digits=2, unit="x"),
                    "met": _median(ratios) >= target,
                }
            )
    return rows


def _ratio_cell(rates: dict[str, list[float]], top: str, bottom: str) -> str:
    if top not in rates or bottom not in rates:
        return ""
    return _spread(_ratios(rates[top], rates[bottom]), digits=2, unit="x")


def peers_section(report: dict[str, Any]) -> list[str]:
    """The page's "Against the peers" section: benchmarks/peers.py's figures."""
    pg = report["engines"].get("postgresql", {}).get("peers")
    my = report["engines"].get("mysql", {}).get("peers")
    if not pg and not my:
        return []
    first = pg or my
    assert first is not None
    st = first["settings"]
    versions = ", ".join((pg or {}).get("versions", {}).values())
    notes = "; ".join(f"{k}: {v}" for k, v in (pg or {}).get("notes", {}).items())
    out = [
        "",
        "## Against the peers",
        "",
        "assetq side by side with the queues its users would otherwise pick, in the same"
        f" PostgreSQL database ({versions or 'no peer installed'}"
        f"{'; ' + notes if notes else ''}), by benchmarks/peers.py (which says how each is"
        " installed and driven). Every side goes through the same client: bare psycopg 3, one"
        " connection per client thread, each call one statement on an autocommit connection"
        " (a function call is atomic by itself; a PgQ consumer's batch is one transaction of"
        " next_batch, get_batch_events and finish_batch), synchronous_commit off; assetq's"
        " side calls its own routines as its Python API sends them, and the API itself"
        " (SQLAlchemy Core) is shown under it where it differs. Consumers: PgQ registers N"
        " consumers on one queue and writes one row per event; pgmq sends to a topic bound to"
        " N queues (one row per queue); procrastinate defers N jobs in one call; assetq"
        " declares N consumers on the asset (one event row and N queue rows). Drains: the"
        f" backlog of {st['backlog']:,} events (one consumer) is topped up before each slice,"
        " untimed; assetq's step is one scheduler pass as `assetq.schedule` sends it (limit"
        " 100; `max_events_per_run` capping each run, a pass making up to 100 capped runs,"
        " since development schema 0011_runs_per_pass; *limit 1* is one run per pass), PgQ's"
        " a batch (the events between two ticks, ticked by hand every 1,000 events or once"
        " for the whole backlog), pgmq's a read of N messages and their delete, procrastinate's"
        " a fetch and a finish. Events/s, median (min-max) of"
        f" {st['repetitions']} repetitions of {st['seconds']:g} s per side in quarter-second"
        " slices, the sides taking turns ("
        f"{st['whole_repetitions']} timed single runs each for the whole backlog); ratios per"
        " repetition. The targets are issue 16's. MariaDB: none of these peers runs on it, so"
        " its column is assetq against the same rows written by plain client statements"
        " (benchmarks/register.py's path), in the same run. Reproduce with"
        " `python benchmarks/bench.py --figures peers` (add `--merge` to keep the other"
        " figures of the page).",
        "",
    ]
    rows: list[list[str]] = []
    for what, rates, targets in _peer_rows(pg or {}):
        assetq_cell = _spread(rates[P_ASSETQ]) if P_ASSETQ in rates else ""
        if P_API in rates:
            assetq_cell += f"<br>API {_spread(rates[P_API])}"
        if P_ONE in rates:
            assetq_cell += f"<br>limit 1: {_spread(rates[P_ONE])}"
        target = ", ".join(f"{peer} >= {t:g}x" for peer, t in targets.items())
        mysql_cell = ""
        if my and what.startswith("producer"):
            key = what.split(", ")[2].split()[0] + "/" + what.split(", ")[3].split()[0]
            mine = my.get("producer", {}).get(key)
            if mine:
                mysql_cell = _ratio_cell(mine, P_ASSETQ, P_PLAIN)
        rows.append(
            [
                what,
                assetq_cell,
                *(_spread(rates[p]) if p in rates else "" for p in P_PEERS),
                *(_ratio_cell(rates, P_ASSETQ, p) for p in P_PEERS),
                target,
                mysql_cell,
            ]
        )
    burn_pg = report["engines"].get("postgresql", {}).get("burndown")
    if burn_pg and BURN_PEER in burn_pg["rates"]:
        r = burn_pg["rates"]
        rows.append(
            [
                f"worker burn-down, {burn_pg['runs']:,} runs, {burn_pg['threads']} threads"
                " (runs/s; the Worker burn-down section)",
                _spread(r[BURN_ASSETQ]),
                "",
                "",
                _spread(r[BURN_PEER]),
                "",
                "",
                _spread(_ratios(r[BURN_ASSETQ], r[BURN_PEER]), digits=2, unit="x"),
                f"{BURN_PEER} >= 1x",
                "no peer (assetq alone)",
            ]
        )
    out += _table(
        [
            "work",
            "assetq, events/s",
            *(f"{p}, events/s" for p in P_PEERS),
            *(f"assetq / {p}" for p in P_PEERS),
            "target",
            "MariaDB: assetq / plain statements",
        ],
        rows,
    )
    if my and not pg:
        out += ["", "MariaDB, assetq against plain statements (events/s):", ""]
        out += _table(
            ["producer (consumers/clients)", "assetq", P_PLAIN, "assetq / plain"],
            [
                [k, _spread(v[P_ASSETQ]), _spread(v[P_PLAIN]), _ratio_cell(v, P_ASSETQ, P_PLAIN)]
                for k, v in my.get("producer", {}).items()
            ],
        )
    if pg:
        out += [
            "",
            "What bounds the ratios (counted from the schemas, not timed): at one event per"
            " transaction with N consumers PgQ writes one row (one index entry, on ev_txid; no"
            " key, no foreign key), pgmq and procrastinate N rows; assetq writes the event row"
            " (3 index entries, 1 foreign-key check) and N queue rows (4 index entries each; no"
            " foreign-key check since development schema 0013_queue_checks, whose two per queue"
            " row were 8"
            " of the 9 at 4 consumers), so with 4 consumers 5 rows, 19 index entries and 1"
            " foreign-key check per event, plus the routine's asset lookup and the fan-out"
            " trigger's join with its FOR KEY SHARE locks; the profile below measures which of"
            " them matter. A whole-backlog or 1,000-event drain of PgQ writes nothing per event"
            " (a batch is a txid range; finish_batch moves the consumer's position), pgmq"
            " deletes a row per event; assetq's run deletes each queue row (4 index entries"
            " each) and inserts a link row per event (2 index entries since development schema"
            " 0014_link_keys, 3 before; no foreign-key check since development schema"
            " 0012_link_checks, whose checks were"
            " more than half of a whole-backlog run)."
            " A one-event drain is a run per event: assetq inserts a dag_run row (10 indexes),"
            " a link, deletes the queue row and updates the consumer row, where procrastinate"
            " updates one job row twice; a pass makes up to 100 such runs (since development"
            " schema 0011_runs_per_pass), one statement and commit where procrastinate sends two.",
        ]
    profile = (pg or {}).get("profile")
    if profile:
        out += profile_section(profile)
    floors = (pg or {}).get("floors")
    if floors:
        out += floors_section(floors)
    return out


def floors_section(floors: dict[str, Any]) -> list[str]:
    """What bounds the missed targets: assetq, the least its layout writes, and PgQ, in the
    same interleaved runs."""
    consumers = floors["consumers"]
    out = [
        "",
        "### What bounds the missed targets, measured",
        "",
        "The least assetq's layout writes for the works whose target it misses, side by side "
        "with assetq and PgQ in one interleaved run per work (benchmarks/peers.py's "
        "measure_floors; the statements are benchmarks/sql/peers_postgresql.sql's floors), with"
        " none of assetq's routines, locks or checks: for the producer and the batch "
        f"({consumers} consumers), a plain INSERT of the events into a namespace as installed "
        "(the fan-out trigger writes one queue row per consumer per event, with the queue's "
        "indexes, which the capped claim and the witness search read), the same into a copy "
        "whose queue keeps its primary key only, and a plain INSERT of the event rows into a "
        "copy without the fan-out trigger (no queue row: the layout's one row per event); for "
        "the whole backlog, one statement that inserts a run row, deletes the consumer's queue "
        "rows and inserts a link per deleted row (no condition, order, claim guard or run "
        "state). Each side is checked to write the rows it says. A floor below the target means"
        " no change to the routines can meet it while the layout keeps a queue row per consumer"
        " per event and a link per consumed event (I1, I4): only a different layout can (the "
        "session notes say what was measured of one).",
        "",
    ]
    works: list[tuple[str, str, str]] = []
    for key in floors:
        if key.startswith("producer/"):
            clients = int(key.split("/")[1])
            works.append(
                (
                    key,
                    f"producer, 1 event per transaction, {consumers} consumers, {clients}"
                    f" client{'s' if clients > 1 else ''}",
                    "PgQ >= 0.7x" if clients == 1 else "PgQ >= 0.9x",
                )
            )
    if "batch" in floors:
        works.append(
            (
                "batch",
                f"batch of {floors['batch_size']:,} events, {consumers} consumers",
                "PgQ >= 0.5x",
            )
        )
    if "whole" in floors:
        works.append(
            (
                "whole",
                f"drain a {floors['backlog']:,} backlog, whole queue in one run",
                "PgQ >= 0.5x",
            )
        )
    rows = []
    for key, what, target in works:
        rates = floors[key]
        pgq = rates.get(P_PGQ)
        for i, (label, values) in enumerate(rates.items()):
            rows.append(
                [
                    what if i == 0 else "",
                    label,
                    _spread(values),
                    _spread(_ratios(values, pgq), digits=2, unit="x")
                    if pgq and label != P_PGQ
                    else "",
                    target if i == 0 else "",
                ]
            )
    out += _table(["work", "side", "events/s", "/ PgQ", "target"], rows)
    return out


def profile_section(profile: dict[str, Any]) -> list[str]:
    """Where the producer's time goes: assetq against copies of its schema without one
    part each, and PgQ, in one interleaved run."""
    rates = profile["rates"]
    base = rates[profile["base"]]
    pgq = rates.get(P_PGQ)
    out = [
        "",
        "### Where the producer's time goes",
        "",
        f"One event per transaction, {profile['consumers']} consumers, {profile['clients']}"
        " client: assetq's register_event in copies of its schema, each made in a namespace of"
        " its own by benchmarks/sql/peers_postgresql.sql (the real schema is not changed),"
        " without one part or with the fan-out written by one client CTE (the same rows and"
        " FOR KEY SHARE locks, without the plpgsql routine, the statement trigger and the"
        " alias probe), and PgQ's insert_event, all in one interleaved run. Every copy is"
        " checked to hold one queue row per consumer per event. *Share of the gap* is how"
        " much of assetq's distance to PgQ the change closes: (variant / PgQ - assetq / PgQ)"
        " / (1 - assetq / PgQ), per repetition.",
        "",
    ]
    rows = []
    for label, values in rates.items():
        if label == P_PGQ:
            continue
        gap = ""
        if pgq and label != profile["base"]:
            shares = [
                (v / p - b / p) / (1 - b / p)
                for v, b, p in zip(values, base, pgq, strict=True)
                if p > b
            ]
            gap = _spread([x * 100 for x in shares], unit="%") if shares else ""
        rows.append(
            [
                RENAMED.get(label, label),
                _spread(values),
                ""
                if label == profile["base"]
                else _spread(_ratios(values, base), digits=2, unit="x"),
                _spread(_ratios(values, pgq), digits=2, unit="x") if pgq else "",
                gap,
            ]
        )
    if pgq:
        rows.append([P_PGQ, _spread(pgq), _spread(_ratios(pgq, base), digits=2, unit="x"), "", ""])
    out += _table(
        ["variant", "events/s", "/ assetq as it is", "/ PgQ", "share of the gap to PgQ"], rows
    )
    return out


#: The labels of benchmarks/burndown.py's alternatives, as its figures store them.
BURN_ASSETQ, BURN_HISTORY, BURN_PEER = "assetq", "assetq with history", "procrastinate"
BURN_ON_ENGINE = "assetq, calls on the Engine"
BURN_IN_TRANSACTION = "assetq, completion in the caller's transaction"
#: Counters per claim, as benchmarks/burndown.py's probes name them.
BURN_COUNTERS = {
    "buffers": "buffers, all the namespace's tables and indexes (hits + reads)",
    "claim_index_buffers": "buffers of the claim's index (dag_run_claim_idx)",
    "index_entries": "index entries read",
    "handler_reads": "Handler_read_* (sum)",
}
#: The counters that must not grow with history; the total of buffers also counts the
#: descents of the UPDATE's index insertions, which grow with each index's height (log).
BURN_FLAT = ("claim_index_buffers", "index_entries", "handler_reads")


def _burndown_targets(title: str, burn: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    rates = burn["rates"]
    if BURN_PEER in rates:
        for label, what in (
            (
                BURN_ASSETQ,
                f"worker burn-down of {burn['runs']:,} runs by {burn['threads']} threads",
            ),
            (
                BURN_ON_ENGINE,
                "the same, claims and completions on the Engine (a pool checkout each)",
            ),
            (
                BURN_IN_TRANSACTION,
                "the same, each completion in the caller's transaction (engine.begin())",
            ),
        ):
            if label not in rates:
                continue
            ratios = _ratios(rates[label], rates[BURN_PEER])
            rows.append(
                {
                    "engine": title,
                    "target": f"{what}, assetq / procrastinate >= 1.0x",
                    "measured": _spread(ratios, digits=2, unit="x"),
                    "met": _median(ratios) >= 1.0,
                }
            )
    probes = burn.get("probes", {})
    high = str(burn.get("history", 0))
    if high != "0" and "0" in probes and high in probes:
        for key, low_values in probes["0"].items():
            if key not in BURN_FLAT:
                continue
            top, bottom = _median(probes[high][key]), _median(low_values)
            rows.append(
                {
                    "engine": title,
                    "target": f"one claim's {key.replace('_', ' ')} with {int(high):,} finished"
                    " runs / without: does not grow (<= 1.1x)",
                    "measured": f"{top:g} / {bottom:g}",
                    "met": bottom > 0 and top / bottom <= 1.1,
                }
            )
    return rows


def burndown_section(report: dict[str, Any]) -> list[str]:
    """The page's "Worker burn-down" section: benchmarks/burndown.py's figures of every
    engine in one table, and the counters of one claim with and without history."""
    engines = [e for e in report["engines"] if "burndown" in report["engines"][e]]
    if not engines:
        return []
    first = report["engines"][engines[0]]["burndown"]
    runs, threads, rounds = first["runs"], first["threads"], first["rounds"]
    history = int(first["history"])
    peers = [report["engines"][e]["burndown"].get("peer") for e in engines]
    peer = next((p for p in peers if p), None)
    out = [
        "",
        "## Worker burn-down",
        "",
        f"A no-op burn-down of {runs:,} queued runs by {threads} worker threads, each thread"
        " keeping a connection of its own in autocommit mode"
        ' (`engine.connect().execution_options(isolation_level="AUTOCOMMIT")`) and looping'
        " `assetq.claim_runs(conn, worker, limit=1)` (a transaction of its own: on"
        " PostgreSQL the function call alone, on MariaDB at READ COMMITTED)"
        ' and `assetq.complete_run(conn, claim, "success")` (a no-op handler writes'
        " nothing: the completion is a transaction of its own, on PostgreSQL the call alone)"
        " until nothing is left; beside it the same calls on the Engine (a pool checkout for"
        " each call), and the completion in the caller's transaction, as a handler that"
        " writes to the database completes: `with engine.begin() as conn:"
        ' assetq.complete_run(conn, claim, "success")` (BEGIN, the call, COMMIT); against'
        " procrastinate's fetch + finish of"
        f" {runs:,} jobs on the same PostgreSQL server, through its own SQL functions"
        " (procrastinate_fetch_job_v2, procrastinate_finish_job_v1, the queries its worker"
        " sends, each in a transaction of its own as its psycopg connector runs them; the"
        f' job kept, as its default delete_jobs="never"){" with " + peer if peer else ""}'
        ", its packaged schema in a schema of its own. Both sides: psycopg 3, one connection"
        " per thread, synchronous_commit off. The queued runs are inserted directly, shaped"
        " as the scheduler pass writes them (one event each, linked), not timed; the"
        f" history is {history:,} finished runs (success, attempt 1) in the same tables."
        f" Runs/s, median (min-max) of {rounds} rounds; in each, the alternatives burn down"
        " at once, taking turns of a quarter second (the order rotates each round), and an"
        " alternative's time is the sum of its turns; ratios per round. procrastinate runs"
        " on PostgreSQL only: MariaDB has assetq alone. Reproduce with"
        " `python benchmarks/burndown.py` (both engines, prints these figures) or"
        " `python benchmarks/bench.py --figures burndown` (benchmarks/burndown.py explains"
        " every choice).",
        "",
    ]
    rows = []
    for engine in engines:
        burn = report["engines"][engine]["burndown"]
        rates = burn["rates"]
        peer_rates = rates.get(BURN_PEER)
        hist = rates.get(BURN_HISTORY)
        in_tx = rates.get(BURN_IN_TRANSACTION)
        on_engine = rates.get(BURN_ON_ENGINE)
        rows.append(
            [
                _engine_title(report, engine),
                _spread(rates[BURN_ASSETQ]),
                _spread(on_engine) if on_engine else "",
                _spread(in_tx) if in_tx else "",
                _spread(hist) if hist else "",
                _spread(peer_rates) if peer_rates else burn.get("peer_note", ""),
                _spread(_ratios(rates[BURN_ASSETQ], peer_rates), digits=2, unit="x")
                if peer_rates
                else "",
                _spread(_ratios(on_engine, peer_rates), digits=2, unit="x")
                if peer_rates and on_engine
                else "",
                _spread(_ratios(in_tx, peer_rates), digits=2, unit="x")
                if peer_rates and in_tx
                else "",
                _spread(_ratios(hist, rates[BURN_ASSETQ]), digits=2, unit="x") if hist else "",
            ]
        )
    out += _table(
        [
            "engine",
            "assetq, runs/s",
            "assetq on the Engine, runs/s",
            "assetq, completion in engine.begin(), runs/s",
            f"assetq, {history:,} finished runs",
            "procrastinate, runs/s",
            "assetq / procrastinate",
            "on the Engine / procrastinate",
            "in engine.begin() / procrastinate",
            "with / without history",
        ],
        rows,
    )
    out += [
        "",
        "One claim's cost, counted, not timed: before the timed rounds, claims at the head of"
        f" {runs:,} queued runs on one connection (after ten that warm it up and let PL/pgSQL"
        " settle on the plans a worker's connection keeps), each in a transaction rolled back"
        " after, in the namespace"
        f" without and with the {history:,} finished runs. PostgreSQL: this transaction's"
        " counters (pg_stat_get_xact_blocks_fetched, index entries returned) over the"
        " namespace's tables and indexes; MariaDB: the session's Handler_read_* counters around"
        " the call, less the counter query's own. Median of the probes.",
        "",
    ]
    rows = []
    for engine in engines:
        probes = report["engines"][engine]["burndown"].get("probes", {})
        levels = sorted(probes, key=int)
        for key in probes.get("0", {}):
            rows.append(
                [
                    _engine_title(report, engine),
                    BURN_COUNTERS.get(key, key),
                    *(f"{_median(probes[level][key]):g}" for level in levels),
                ]
            )
    levels = sorted(first.get("probes", {}), key=int)
    out += _table(
        ["engine", "per claim", *(f"{int(level):,} finished runs" for level in levels)], rows
    )
    return out


# -- plots -----------------------------------------------------------------------------------


def _plots(report: dict[str, Any], folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    engines = list(report["engines"])
    written: list[str] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        written.append(name)

    def errors(values: Sequence[Sequence[float]], scale: float = 1.0) -> list[list[float]]:
        return [
            [(_median(v) - min(v)) * scale for v in values],
            [(max(v) - _median(v)) * scale for v in values],
        ]

    with_reg = [e for e in engines if "registration" in report["engines"][e]]
    if with_reg:
        fig, axes = plt.subplots(1, len(with_reg), figsize=(6 * len(with_reg), 4), squeeze=False)
        for ax, engine in zip(axes[0], with_reg, strict=True):
            reg = report["engines"][engine]["registration"]
            threads = [str(t) for t in reg["threads"]]
            labels = list(reg["rates"])
            width = 0.8 / len(labels)
            for i, label in enumerate(labels):
                values = [reg["rates"][label][t] for t in threads]
                xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(threads))]
                ax.bar(
                    xs,
                    [_median(v) for v in values],
                    width,
                    yerr=errors(values),
                    label=label,
                    capsize=3,
                )
            ax.set_xticks(
                range(len(threads)), [f"{t} thread{'s' if t != '1' else ''}" for t in threads]
            )
            ax.set_ylabel("events/s (median, min-max)")
            ax.set_title(f"Registration, {_engine_title(report, engine)}")
            ax.legend(fontsize=8)
        save(fig, "registration.png")

    with_batch = [e for e in engines if "batch" in report["engines"][e]]
    if with_batch:
        fig, axes = plt.subplots(
            1, len(with_batch), figsize=(6 * len(with_batch), 4), squeeze=False
        )
        for ax, engine in zip(axes[0], with_batch, strict=True):
            rates = report["engines"][engine]["batch"]["rates"]
            labels = list(rates)
            values = [rates[k] for k in labels]
            ax.bar(range(len(labels)), [_median(v) for v in values], yerr=errors(values), capsize=3)
            ax.set_xticks(range(len(labels)), [k.replace(", ", ",\n") for k in labels], fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel("events/s (median, min-max; log scale)")
            ax.set_title(f"Batch registration, {_engine_title(report, engine)}")
        save(fig, "batch.png")

    with_pass = [e for e in engines if "pass" in report["engines"][e]]
    if with_pass:
        fig, axes = plt.subplots(1, len(with_pass), figsize=(6 * len(with_pass), 4), squeeze=False)
        for ax, engine in zip(axes[0], with_pass, strict=True):
            data = report["engines"][engine]["pass"]
            levels = [str(h) for h in data["history"]]
            for label, name in (("assetq", "assetq"), ("window", "timestamp window (baseline)")):
                values = [data[label][h] for h in levels]
                ax.errorbar(
                    [int(h) for h in levels],
                    [_median(v) * 1000 for v in values],
                    yerr=errors(values, 1000),
                    marker="o",
                    capsize=3,
                    label=name,
                )
            ax.set_xscale("log")
            ax.set_ylim(bottom=0)
            ax.set_xlabel("consumed events of history")
            ax.set_ylabel("pass time, ms (median, min-max)")
            ax.set_title(
                f"Pass over {data['queued_rows']} queued rows, {data['consumers']:,} consumers,"
                f"\n{_engine_title(report, engine)}"
            )
            ax.legend(fontsize=8)
        save(fig, "pass.png")

    with_run = [e for e in engines if "large_run" in report["engines"][e]]
    if with_run:
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
        for engine in with_run:
            data = report["engines"][engine]["large_run"]
            sizes = [str(s) for s in data["sizes"]]
            seconds = [data["seconds"][s] for s in sizes]
            peaks = [[float(p) for p in data["peak_bytes"][s]] for s in sizes]
            xs = [int(s) for s in sizes]
            title = _engine_title(report, engine)
            left.errorbar(
                xs,
                [_median(v) * 1000 for v in seconds],
                yerr=errors(seconds, 1000),
                marker="o",
                capsize=3,
                label=title,
            )
            right.errorbar(
                xs,
                [_median(v) / 1e6 for v in peaks],
                yerr=errors(peaks, 1e-6),
                marker="o",
                capsize=3,
                label=title,
            )
        left.set_xlabel("events consumed by the run")
        left.set_ylabel("pass time, ms")
        left.set_title("One run consuming a backlog: time")
        right.set_xlabel("events consumed by the run")
        right.set_ylabel("Python peak allocation, MB (tracemalloc)")
        right.set_title("One run consuming a backlog: Python memory")
        for ax in (left, right):
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=8)
        save(fig, "large_run.png")
    return written


# -- the page --------------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


#: Written by benchmarks/latency.py --output, next to the plots; included in the page.
LATENCY = "latency.md"


def latency_section(latency: str | None) -> list[str]:
    """The page's section on benchmarks/latency.py: its --output file, or how to make it."""
    heading = ["", "## Event -> run latency and what the wake-up costs producers", ""]
    if latency:
        return [
            *heading,
            "The long-running scheduler (`assetq scheduler`), from benchmarks/latency.py, a"
            " separate run from the figures above (docs/operations.md explains the wake-up):",
            "",
            latency.rstrip("\n"),
        ]
    return [
        *heading,
        "Not measured for this page: `python benchmarks/latency.py --output"
        f" docs/{PLOTS}/{LATENCY}` writes the figures that go here.",
    ]


#: Written by benchmarks/wakeup_gap.py --output, next to the plots; included in the page.
WAKEUP_GAP = "wakeup_gap.md"


def wakeup_gap_section(wakeup: str | None) -> list[str]:
    """The page's section on benchmarks/wakeup_gap.py: its --output file, or how to make it."""
    heading = ["", "## The next run of a capped consumer, and the first hop", ""]
    if wakeup:
        return [
            *heading,
            "From benchmarks/wakeup_gap.py (issue 26, item 4), a separate run from the figures"
            " above: `assetq scheduler` and `assetq worker` as processes started from the"
            " command line with their defaults, and procrastinate's worker beside them"
            " (docs/workers.md, The next run of a capped consumer, explains the wake-up):",
            "",
            wakeup.rstrip("\n"),
            "",
            "Where the first hop's time goes on PostgreSQL (the split column): one hop, as "
            "procrastinate's. The producer's commit notifies the waiting scheduler and the "
            "listening worker alike ('queued'); the worker's first free slot claims with a pass "
            "of its own consumers first, one statement that makes the run already claimed "
            "(created_at and started_at are one instant, so the split's claim share is 0 and "
            "what the statement does after inserting the run, deleting the queue rows and "
            "linking the events, falls in the handler's share), and calls the handler; the "
            "scheduler, seeing a worker listen, waits 20 ms before its pass (its head start), "
            "which then finds nothing to do. procrastinate's deferring commit notifies its "
            "worker, which fetches the job (its 'started' event) and runs the task in a thread. "
            "assetq's statement does more (a pass's writes) than procrastinate's fetch, and its "
            "handler is called sooner after it. Since 2026-12-06 07:00 UTC the run is inserted "
            "claimed, at its first attempt, instead of inserted queued and then updated by the "
            "claim (a second version of the row and an entry in each of dag_run's eleven "
            "indexes; `tests/test_first_hop.py` counts one insert and no update); that alone "
            "was within this machine's noise (six runs: p50 0.92x-1.09x idle, 0.86x-1.03x under "
            "the flood). Since 10:10 UTC the statement does less after an idle gap, where each "
            "SQL statement inside it costs 40-200 us (timed inside the routine): its check for "
            "older claimable runs had a plan that read all of dag_run once it held a few "
            "thousand runs, the consumers' rows were read twice, the condition took two queries. "
            "The statement alone after an 80 ms gap went from 1.66-1.75 ms to 1.47-1.62 ms, "
            "procrastinate's fetch 1.18-1.26 ms in the same interleaved runs; assetq's client "
            "side (the listener's wake-up of a slot, the call, the Claim, the 'claimed' log "
            "line: about 0.5 ms) is the shorter. The table above is one of four runs of this "
            "command that day with 60 probes per block (240 per system and load): assetq / "
            "procrastinate p50 0.85x-0.95x idle and 0.87x-0.94x under the flood, overall p99 "
            "0.86x-1.00x idle and 0.84x-1.01x under the flood. With 30 probes per block (the "
            "default until then) one run's p99 was 1.22x idle and 1.55x under the flood: the "
            "p99 of 120 probes is the second-slowest, and one or two slow hops decide it (both "
            "systems have them: assetq's a statement taking 2-5 ms instead of 1.3, "
            "procrastinate's slowest hops 4-38 ms in those runs). Before "
            "(2026-12-05 16:06 UTC, the same command), assetq took two hops, the scheduler's "
            "pass, its commit and notification ('runs'), then the worker's claim: 2.17x "
            "procrastinate's p50 idle and 2.09x under the flood. A worker's pass alone was "
            "tried first and not kept (1.72x, 1.86x): the scheduler, woken by the same "
            "notification, took the consumer first; so the worker's pass now waits for a "
            "consumer another pass holds and claims that pass's run, and the scheduler gives "
            "listening workers their head start. The claim's commit does not wait for the disk "
            "(docs/workers.md says what a crash can take). On MariaDB there is no notification: "
            "the first hop waits for the scheduler's poll (5 s by default) and the worker's "
            "idle backoff (50 ms doubling to 1 s); the gap after a capped consumer's run does "
            "not, as the worker that ended it runs the pass and claims at once.",
        ]
    return [
        *heading,
        "Not measured for this page: `python benchmarks/wakeup_gap.py --output"
        f" docs/{PLOTS}/{WAKEUP_GAP}` writes the figures that go here.",
    ]


#: Written by benchmarks/register.py --output, next to the plots; included in the page.
PRODUCER = "register.md"


def producer_section(producer: str | None) -> list[str]:
    """The page's section on benchmarks/register.py: its --output file, or how to make it."""
    heading = ["", "## The producer's default path", ""]
    if producer:
        return [
            *heading,
            "From benchmarks/register.py (issue 29, item 5), a separate run from the figures"
            " above: `assetq.register_event` as an application calls it, in its own"
            " transaction on an Engine's connection, with the default `savepoint=True` (an"
            " assetq error leaves the caller's transaction usable) and with `savepoint=False`,"
            " against the same rows written by two plain INSERTs (docs/python.md, What an"
            " error leaves of your transaction, says how the savepoint costs no round trip):",
            "",
            producer.rstrip("\n"),
            "",
            "Targets (issue 29, item 5), PostgreSQL, by default: >= 0.9x the plain INSERTs at"
            " 1 thread and >= 0.7x at 8. Before, the default was the SAVEPOINT, call, RELEASE"
            " column's path, with the call through SQLAlchemy's execute: the issue measured"
            " 0.61x and 0.33x, and this command (3 rounds, without the third column) 0.66x"
            " and 0.49x at the commit before the change, 5719ce3. Each variant writes in the"
            " caller's transaction through what an application would use: the plain INSERTs"
            " through SQLAlchemy's Connection.execute, whose client work counts (at 8"
            " threads on 2 cores it is a large part of the plain side's time); assetq's calls"
            " through the driver's cursor, as the package sends them when nothing listens to"
            " the connection's statements.",
        ]
    return [
        *heading,
        "Not measured for this page: `python benchmarks/register.py --output"
        f" docs/{PLOTS}/{PRODUCER}` writes the figures that go here.",
    ]


#: Written by benchmarks/burndown_cli.py --output, next to the plots; included in the page.
WORKERS = "burndown_cli.md"


def workers_section(workers: str | None) -> list[str]:
    """The page's section on benchmarks/burndown_cli.py: its --output file, or how to make it."""
    heading = ["", "## The worker as users start it", ""]
    if workers:
        return [
            *heading,
            "From benchmarks/burndown_cli.py (issue 29, item 4), a separate run from the"
            " figures above: `assetq worker` and `procrastinate worker` as processes started"
            " from their command lines, the same concurrency, each burning down a fresh backlog"
            " of queued jobs, with a handler that does nothing and one that inserts one row"
            " (assetq: in the transaction that completes the run; procrastinate: through its"
            " job's connector). Rates from the database's timestamps (first claim to last"
            " completion), so that start-up does not count; the systems take turns, their"
            " order alternating by round, and ratios are per round. Target: assetq /"
            " procrastinate >= 1.0x with both handlers.",
            "",
            workers.rstrip("\n"),
        ]
    return [
        *heading,
        "Not measured for this page: `python benchmarks/burndown_cli.py --output"
        f" docs/{PLOTS}/{WORKERS}` writes the figures that go here.",
    ]


def markdown(
    report: dict[str, Any],
    plots: Sequence[str],
    latency: str | None = None,
    wakeup: str | None = None,
    producer: str | None = None,
    workers: str | None = None,
) -> str:
    machine = report["machine"]
    cfg = report["config"]
    out: list[str] = [
        "# Benchmarks",
        "",
        "Generated by `" + report["command"] + "` (about "
        f"{report['elapsed_s'] / 60:.0f} min, {report['date']}); do not edit by hand: run the"
        " command again (`python benchmarks/report.py` re-draws this page and its plots from"
        " the raw figures, [benchmarks.json](benchmarks.json)). Each figure is a median of"
        " repetitions with min-max. Within a repetition the alternatives take turns in slices"
        " of a quarter second (the passes: one pass each, at every history level), and ratios"
        " are taken per repetition, so load from elsewhere falls on all of them alike. The"
        " machine is small and shared: read ratios, not absolute times.",
    ]
    for update in report.get("updates", []):
        out += [
            "",
            f"Figures {', '.join(update['figures'])}: measured again by `{update['command']}`"
            f" (about {update['elapsed_s'] / 60:.0f} min, {update['date']}, load average"
            f" {update['load_before']} before, {update['load_after']} after; assetq"
            f" {_assetq(update['machine']['assetq'])}); the rest of the page is the run above.",
        ]
    out += [
        "",
        "## Machine and settings",
        "",
    ]
    out += _table(
        ["", ""],
        [
            ["CPU", f"{machine['cpu']}, {machine['cores']} cores"],
            ["memory", machine["memory"]],
            ["OS", machine["os"]],
            [
                "Python and drivers",
                f"Python {machine['python']}, SQLAlchemy {machine['sqlalchemy']},"
                f" psycopg {machine['psycopg']}, PyMySQL {machine['pymysql']}",
            ],
            ["assetq", _assetq(machine["assetq"])],
            [
                "load average (1 min)",
                f"{report['load_before']} before, {report['load_after']} after: other work on"
                " the machine shows up as spread",
            ],
        ],
    )
    for engine, data in report["engines"].items():
        settings = ", ".join(f"{k} = {v}" for k, v in data.get("settings", {}).items())
        out += ["", f"- **{_engine_title(report, engine)}** ({data['server']}): {settings}."]
    out += [
        "",
        "Commits do not wait for the disk in the figures below, except where marked"
        " *durable*: the benchmark's PostgreSQL sessions run with synchronous_commit = off (a"
        " session setting; the server keeps its own, and fsync stays on), and the throw-away"
        " MariaDB flushes its log once a second (innodb_flush_log_at_trx_commit = 2, as"
        " tests/dbs.py starts it). The figures compare the work of client and server, not the"
        " disk's flush latency; the durable table shows what a flush per commit does to them."
        " The scheduler pass runs at READ COMMITTED (assetq.schedule sets it); producers run at"
        " the server's default isolation shown above.",
        "",
        "## Targets",
        "",
    ]
    out += _table(
        ["engine", "target", "measured (median, min-max)", ""],
        [
            [r["engine"], r["target"], r["measured"], "met" if r["met"] else "**missed**"]
            for r in targets_summary(report)
        ],
    )

    for engine, data in report["engines"].items():
        title = _engine_title(report, engine)
        reg = data.get("registration")
        if reg:
            out += [
                "",
                f"## Registration, {title}",
                "",
                f"Events/s; each thread its own connection, each event its own committed"
                f" transaction, {reg['consumers_per_asset']} consumers per asset;"
                f" {cfg['repetitions']} repetitions of {cfg['seconds']:g} s rounds. Ratios are"
                " to plain statements.",
                "",
            ]
            labels = list(reg["rates"])
            plain = reg["rates"]["plain statements"]
            rows = []
            for threads in reg["threads"]:
                t = str(threads)
                row = [t]
                for label in labels:
                    cell = _spread(reg["rates"][label][t])
                    if label != "plain statements":
                        ratios = _ratios(reg["rates"][label][t], plain[t])
                        cell += "<br>" + _spread(ratios, digits=2, unit="x")
                    row.append(cell)
                rows.append(row)
            out += _table(["threads", *labels], rows)
            durable = reg.get("durable_rates")
            if durable:
                out += [
                    "",
                    "The same at one thread, *durable*: every commit waits for the disk"
                    " (PostgreSQL synchronous_commit = on; MariaDB innodb_flush_log_at_trx_commit"
                    " = 1 on the throw-away server).",
                    "",
                ]
                dplain = durable["plain statements"]["1"]
                row = ["1"]
                for label in labels:
                    cell = _spread(durable[label]["1"])
                    if label != "plain statements":
                        ratios = _ratios(durable[label]["1"], dplain)
                        cell += "<br>" + _spread(ratios, digits=2, unit="x")
                    row.append(cell)
                out += _table(["threads", *labels], [row])
        batch = data.get("batch")
        if batch:
            out += [
                "",
                f"## Batch registration, {title}",
                "",
                "Events/s, one thread;"
                f" {cfg['repetitions']} repetitions of {cfg['batch_seconds']:g} s.",
                "",
            ]
            labels = list(batch["rates"])
            first = batch["rates"][labels[0]]
            out += _table(
                ["", "events/s", "batch is"],
                [
                    [
                        label,
                        _spread(batch["rates"][label]),
                        ""
                        if i == 0
                        else _spread(_ratios(first, batch["rates"][label]), digits=1, unit="x"),
                    ]
                    for i, label in enumerate(labels)
                ],
            )
        passes = data.get("pass")
        if passes:
            out += [
                "",
                f"## Scheduler pass against history, {title}",
                "",
                f"One pass over {passes['queued_rows']} queued rows ({passes['queued_rows']} runs"
                f" created) among {passes['consumers']:,} consumers; history is consumed events,"
                " 4 per run, with their runs and links (tests/history.py); the baseline has the"
                " same history in its own tables. Every level is loaded in a namespace (and"
                " schema) of its own first, then each repetition runs both passes at every level"
                f" side by side. Milliseconds, {cfg['pass_repetitions']} repetitions.",
                "",
            ]
            rows = []
            for level in passes["history"]:
                h = str(level)
                rows.append(
                    [
                        f"{level:,}",
                        _spread(passes["assetq"][h], 1000),
                        _spread(passes["window"][h], 1000),
                        _spread(
                            _ratios(passes["window"][h], passes["assetq"][h]), digits=1, unit="x"
                        ),
                    ]
                )
            out += _table(["history events", "assetq", "timestamp window", "assetq is"], rows)
        run = data.get("large_run")
        if run:
            out += [
                "",
                f"## One run consuming a backlog, {title}",
                "",
                "One consumer, N events queued; one pass creates one run linking all of them"
                " and clears the queue. Time of assetq.schedule(); Python memory is the"
                f" tracemalloc peak during it. {cfg['run_repetitions']} repetitions.",
                "",
            ]
            out += _table(
                ["events", "time, ms", "Python peak, MB"],
                [
                    [
                        f"{int(s):,}",
                        _spread(run["seconds"][str(s)], 1000),
                        _spread([float(p) for p in run["peak_bytes"][str(s)]], 1e-6, 2),
                    ]
                    for s in run["sizes"]
                ],
            )
    out += burndown_section(report)
    out += peers_section(report)
    out += latency_section(latency)
    out += wakeup_gap_section(wakeup)
    out += producer_section(producer)
    out += workers_section(workers)
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{name[:-4]}]({PLOTS}/{name})" for name in plots]
    out += [
        "",
        "## What bounds the ratios",
        "",
        "- Batch against single calls: a batch saves each event's round trip and client-side"
        " work, not its server-side work: the event row with its foreign-key check and its"
        " queue rows (on MySQL/MariaDB also one execution of the row-level fan-out trigger per"
        " event: MySQL has no statement-level triggers). With 4 consumers per asset that work"
        " is a large share of what a single call costs, and it bounds the ratio.",
        "- assetq against the Airflow-style path: the path here is SQLAlchemy Core, leaner than"
        " Airflow's ORM (no model objects, flushes or relationship loading); what it keeps is"
        " the round trips, so the ratio is about the round trips alone.",
        "- assetq inside BEGIN/COMMIT against plain statements: BEGIN and COMMIT are round trips"
        " of their own in both, so sending one statement instead of two saves a smaller share;"
        " on an autocommit connection the single call is the whole transaction.",
        "- One run of a backlog: the run's links are inserted and its queue rows deleted in"
        " set-based statements; what grows with the backlog is the work per link (its index"
        " entries; the link table has no foreign keys since development schema"
        " 0012_link_checks) and the"
        " run's ids returned to Python.",
        "- Worker burn-down against procrastinate: per run both sides lock a row with SKIP"
        " LOCKED and update it to claim, update it to finish, and commit. assetq does more"
        " in each: its claim function reads the run's event ids (and, when a candidate's"
        " lease expired, fails it if that was its last attempt), and each claim and"
        " completion changes indexed columns (state, not_before) of a table with ten indexes,"
        " so every update adds an entry to each of them. Measured with track_functions, one"
        " thread, the server's time in the functions is about the same on both sides"
        " (claim_runs + complete_run against procrastinate_fetch_job_v2 + finish_job_v1"
        " with its status trigger). On PostgreSQL a claim is one round trip (the function"
        " call alone, on an autocommit connection) and so is a completion on a worker's own"
        " autocommit connection or on the Engine, against three each (BEGIN, the query,"
        " COMMIT) for procrastinate's connector; a completion in engine.begin() is three too."
        " What decides the ratio is the client, under one interpreter lock for all 8 threads"
        " on 2 cores shared with the server: bare psycopg calls of assetq's two functions"
        " (a side measurement, not one of this page's figures) burned down faster than"
        " procrastinate's in every round they were measured. The API's own client work per run"
        " (arguments checked, Claim and Run built, the driver's cursor) costs part of"
        " that; on the Engine each call also checks a connection out of SQLAlchemy's pool"
        " and back (about half of what the API adds), and engine.begin() adds SQLAlchemy's"
        " Connection and transaction and two round trips.",
        "- A claim with finished runs in the history: it reads the same index entries and the"
        " same pages of the claim's partial index (finished runs are not in it); its total of"
        " buffers grows only by the descents of its UPDATE into dag_run's other B-trees, one"
        " page per level, i.e. with the logarithm of the table's rows. What a claim does step"
        " over is the dead entries that runs claimed since the last vacuum left at the head of"
        " the claim index (their earlier versions): about a page per 150-200 claims until"
        " (auto)vacuum removes them, as in procrastinate's index of jobs to do.",
        "",
        "## How the alternatives are made comparable",
        "",
        "- Registration: the variants run in twin namespaces of the same database (same"
        " schema, consumers and assets); in the plain and Airflow-style namespaces only the"
        " fan-out trigger is switched off (PostgreSQL: DISABLE TRIGGER; MySQL: dropped), so"
        " those clients write the queue rows themselves and every foreign key, unique index"
        " and check still runs. After the run, every namespace is checked to hold one queue"
        " row per consumer per event, with the event's timestamp.",
        "- assetq (own transaction) is register_event on an autocommit connection: the call is"
        " atomic by itself (one statement on PostgreSQL; one writing statement in the MySQL"
        " procedure), so it is committed in its one round trip. The plain and Airflow-style"
        " clients need BEGIN ... COMMIT around their statements to be atomic at all.",
        "- Pass: the baseline is tests/stress.py's WindowAlgorithm (Airflow 3.0-3.3's timestamp"
        " window), on the same consumers, the same pending events and the same amount of"
        " history; both passes create the same number of runs.",
        "",
    ]
    return "\n".join(out)


def write(report: dict[str, Any], out: Path) -> None:
    """docs/benchmarks.json, docs/benchmarks/*.png and docs/benchmarks.md (which includes
    docs/benchmarks/latency.md when benchmarks/latency.py wrote it,
    docs/benchmarks/wakeup_gap.md when benchmarks/wakeup_gap.py did,
    docs/benchmarks/register.md when benchmarks/register.py did, and
    docs/benchmarks/burndown_cli.md when benchmarks/burndown_cli.py did)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(report, indent=1) + "\n", "utf-8")
    plots = _plots(report, out / PLOTS)
    latency = out / PLOTS / LATENCY
    text = latency.read_text("utf-8") if latency.exists() else None
    gap = out / PLOTS / WAKEUP_GAP
    gap_text = gap.read_text("utf-8") if gap.exists() else None
    producer = out / PLOTS / PRODUCER
    producer_text = producer.read_text("utf-8") if producer.exists() else None
    workers = out / PLOTS / WORKERS
    workers_text = workers.read_text("utf-8") if workers.exists() else None
    (out / "benchmarks.md").write_text(
        markdown(report, plots, text, gap_text, producer_text, workers_text), "utf-8"
    )


if __name__ == "__main__":  # re-draw the page and plots from the raw figures of a run
    import sys

    source = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks.json")
    write(json.loads(source.read_text("utf-8")), source.parent)
