"""`dif quality CANDIDATE [--reference FILE]`: decodability, sanity, PSNR / SSIM / SNR against a reference,
the recorded human review, and a verdict PASS / FAIL / MANUAL REVIEW REQUIRED (`dif.quality`)."""

from __future__ import annotations

from pathlib import Path

import click

from dif_tools.output import emit_document


@click.command("quality")
@click.argument("candidate", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--reference", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--min-psnr", default=30.0, show_default=True, type=float, help="dB, per compared frame.")
@click.option("--min-ssim", default=0.95, show_default=True, type=float, help="8x8-window luma SSIM, per frame.")
@click.option("--min-snr", default=20.0, show_default=True, type=float, help="dB, audio against the reference.")
@click.option(
    "--record-review",
    type=click.Choice(["accept", "reject"]),
    default=None,
    help="Record your verdict on this file (CANDIDATE.review.json) before assessing it.",
)
@click.option("--reviewer", default="", help="Who reviewed it (with --record-review).")
@click.option("--notes", default="", help="What the reviewer saw (with --record-review).")
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def quality(
    candidate: Path,
    reference: Path | None,
    min_psnr: float,
    min_ssim: float,
    min_snr: float,
    record_review: str | None,
    reviewer: str,
    notes: str,
    as_json: bool,
) -> None:
    """Assess CANDIDATE (PNG / JPEG / WebP, WAV, MP4). Exit 1 on FAIL; PASS needs the numbers (or sanity
    alone without a reference) and a recorded review accepting these bytes. Scalar metrics never replace
    looking at the output."""
    from dif.quality.assess import FAIL, Bars, assess, write_review

    if record_review is not None:
        write_review(candidate, record_review, reviewer, notes)
    report = assess(candidate, reference, Bars(min_psnr, min_ssim, min_snr))
    if as_json:
        emit_document("quality", report)
    else:
        media = report.get("media") or {}
        click.echo(f"{candidate}: {media.get('kind', 'undecodable')}")
        for row in (report.get("metrics") or {}).get("frames", []):
            p = "identical" if row["psnr_db"] is None else f"{row['psnr_db']:.2f} dB"
            click.echo(f"  frame {row['frame']}: PSNR {p}, SSIM {row['ssim']:.4f}")
        audio = (report.get("metrics") or {}).get("audio")
        if audio is not None:
            value = "identical" if audio["snr_db"] is None else f"{audio['snr_db']:.2f} dB"
            click.echo(f"  audio SNR {value}")
        click.echo(
            f"{report['verdict']}: {'; '.join(report['reasons']) or 'numbers admit it and a review accepted it'}"
        )
    if report["verdict"] == FAIL:
        raise SystemExit(1)
