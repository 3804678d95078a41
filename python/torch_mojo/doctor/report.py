"""The doctor's report: one table for the whole job, the measured links,
and the problems, as text or as JSON (the same data)."""

from __future__ import annotations

import os

from torch_mojo import torchcomms
from torch_mojo.doctor import nccl_log
from torch_mojo.doctor.checks import nodes_of, rank_ranges
from torch_mojo.bench.report import human
from torch_mojo.doctor.facts import number_ranges
from torch_mojo.doctor.job import Job
from torch_mojo.doctor.variables import ERROR


def library_text(lookup: dict) -> str:
    if not lookup.get("path"):
        return "none found"
    version = f" {lookup['version']}" if lookup.get("version") is not None else ""
    return f"{os.path.basename(lookup['path'])}{version} ({lookup['source']})"


def between_nodes_text(fabric: dict, spans_nodes: bool) -> str:
    if fabric["in_use"]:
        return fabric["in_use"].split(" (")[0] + ("" if spans_nodes else " (unused: one node)")
    return f"none: {fabric['provider']} is not usable here" if fabric["failure"] else "none"


def table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def summary(job: Job, world_size: int, problems: list[dict], status: int, measured: bool) -> dict:
    """The report as data: what `--json` prints."""
    return {"world_size": world_size, "nodes": list(nodes_of(job)), "missing": job.missing,
            "broken": job.broken, "ranks": [job.facts[rank] for rank in sorted(job.facts)], "measured": measured,
            "links": job.links, "all_reduce": job.all_reduce,
            "vendor_networks": [nccl_log.summary(log, len(job.vendor_networks)) for log in job.vendor_networks.values()],
            "problems": problems, "exit_status": status}


def header_lines(job: Job, world_size: int) -> list[str]:
    nodes = nodes_of(job)
    first = job.facts[min(job.facts)] if job.facts else {}
    lines = [f"torch-mojo doctor: {world_size} ranks, {len(job.facts)} checked in, on {len(nodes)} "
             f"node{'s' if len(nodes) != 1 else ''}"
             + (f" (launcher: {first['launcher']}); torch-mojo {first['torch_mojo']}, torch {first['torch']}"
                if first else "")]
    if not job.facts:
        return lines
    node_numbers = {node: number for number, node in enumerate(nodes)}
    rows = [["rank", "node", "host", "local", "device", "cpus", "collectives (cpu)", "accelerator collectives",
             "within node", "between nodes"]]
    for rank in sorted(job.facts):
        facts = job.facts[rank]
        accelerator = [lookup for device, lookup in facts["libraries"].items() if device != "cpu"]
        rows.append([str(rank), str(node_numbers[facts["node"]]), facts["host"], str(facts["local_rank"]),
                     facts["device"], number_ranges(facts["cpus"]), library_text(facts["libraries"].get("cpu", {})),
                     library_text(accelerator[0]) if accelerator else "-", "shared memory",
                     between_nodes_text(facts["fabric"], len(nodes) > 1)])
    lines += ["", *table(rows)]
    cache = {facts["cache"]["path"] for facts in job.facts.values()}
    fabric = first["fabric"]
    lines += ["", f"libfabric: {fabric['library'] or 'none'}" + (f" {fabric['version']}" if fabric["version"] else "")
              + (f"; fabric NICs: {', '.join(fabric['hardware'])}" if fabric["hardware"] else "; no fabric NIC"),
              f"cache directory: {', '.join(sorted(cache))} ({first['cache']['filesystem']})",
              torchcomms.status_line(first["torchcomms"]).split("\n")[0]]
    return lines


def measurement_lines(job: Job, size: int) -> list[str]:
    if not job.links and not job.all_reduce:
        return []
    node_numbers = {node: number for number, node in enumerate(nodes_of(job))}
    rows = [["link", "ranks", "latency", "bandwidth"]]
    for link in job.links:
        a, b = (node_numbers[job.facts[rank]["node"]] for rank in (link["a"], link["b"]))
        where = f"within node {a}" if link["kind"] == "within node" else f"node {a} - node {b}"
        rows.append([where, f"{link['a']} - {link['b']}", f"{link['latency_us']:.1f} us",
                     f"{link['bandwidth_gbps']:.2f} GB/s"])
    lines = ["", f"links (point to point through mojo: median of 200 round trips of 8 B, and of 10 of "
             f"{human(size)}):"]
    lines += ["  " + line for line in table(rows)] if len(rows) > 1 else ["  (one rank: no link)"]
    if job.all_reduce:
        result = job.all_reduce
        lines.append(f"all_reduce of {human(result['bytes'])} on every rank: "
                     f"{'correct' if result['correct'] else 'WRONG'}, {result['time_us'] / 1000:.2f} ms, "
                     f"busbw {result['busbw_gbps']:.2f} GB/s")
    if job.vendor_networks:
        lines += ["", "RCCL/NCCL's network, from their NCCL_DEBUG=INFO lines during a GPU all-reduce:"]
        lines += ["  " + line for line in nccl_log.table_lines(job.vendor_networks)]
    return lines


def problem_lines(problems: list[dict]) -> list[str]:
    if not problems:
        return []
    return ["", "problems:"] + [f"  {item['severity'].upper():7s}  {rank_ranges(item['ranks'])}: {item['message']}"
                               for item in problems]


def verdict_lines(problems: list[dict]) -> list[str]:
    errors = sum(item["severity"] == ERROR for item in problems)
    warnings = len(problems) - errors
    if not problems:
        return ["", "no problems found"]
    verdict = "training would fail or crawl: fix the errors" if errors else "nothing that stops training"
    return ["", f"{errors} error{'s' if errors != 1 else ''}, {warnings} warning{'s' if warnings != 1 else ''}: "
                f"{verdict}"]
