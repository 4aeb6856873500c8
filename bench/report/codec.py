"""The report's section 3: the wire codec against the standard library's json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import plots
from bench.report.cells import table, whole


def codec_section(res: dict[str, Any], images: Path) -> list[str]:
    """Section 3: the codec's rates and ratios, plot and verdict."""
    rows: list[dict[str, Any]] = res["rows"]
    out = [
        "## 3. Codec",
        "",
        f"*Measured {res['measured']}.* The same frames through `nodetask.messages` (msgspec Structs, a tagged",
        "union, the memoised `messages.parse_route` as the route's decode hook) and through the standard",
        "library's `json` made equivalent: dicts, dispatch on `op`, the same type checks on every field, the",
        "same route parsing, compact output. Both read the frames into equal values (checked before timing).",
        "*New route* rows parse a route neither side has seen (plain `Route.parse`, no memo): a node task's",
        "first report. The others see a route already parsed, as a hub does for a node task's later reports.",
        "Medians of",
        f"{res['repeats']} rounds of {res['iterations']:,} messages; the ratio is the median of per-round ratios.",
        "",
    ]
    table_rows = [
        (
            r["operation"],
            str(r["frame_bytes"]),
            whole(r["msgspec_per_s"]),
            whole(r["json_per_s"]) if r["json_per_s"] else "(same code)",
            f"**{r['ratio']:.1f}x**" if r["ratio"] else "",
        )
        for r in rows
    ]
    out += table(("operation", "bytes", "nodetask.messages msgs/s", "stdlib json msgs/s", "ratio"), table_rows)
    out.append("")
    if plots.codec(rows, images / "codec.png"):
        out += ["![benchmark 3](bench/codec.png)", ""]
    ratios = {r["operation"]: r["ratio"] for r in rows if r["ratio"]}
    low = {k: v for k, v in ratios.items() if v < 5 and "new route" not in k}
    first = {k: v for k, v in ratios.items() if "new route" in k}
    if not low:
        out.append("**Target** (at least 5x): met on every operation, for routes seen before.")
    else:
        out.append(
            "**Target** (at least 5x): met on every operation except "
            + ", ".join(f"{k}: **{v:.1f}x**, missed by {5 - v:.1f}x" for k, v in low.items())
            + "."
        )
    if first:
        out += [
            "",
            "A report whose route is new decodes "
            + ", ".join(f"**{v:.1f}x**" for v in first.values())
            + f" as fast: parsing the route is {res['route_share']:.0%} of that decode and the same code on"
            " both sides (see the notes).",
        ]
    out.append("")
    return out
