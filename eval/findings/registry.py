"""Every finding, in the order the index lists them."""

from __future__ import annotations

from eval.findings import (
    adaptation,
    compute_gap,
    data_constrained,
    eso_alpha,
    pathstar,
    remdm_steps,
    reversal,
    sample_quality,
    uniform_masked,
)
from eval.findings.common import Finding

FINDINGS: dict[str, Finding] = {
    finding.name: finding
    for finding in (
        data_constrained.FINDING,
        compute_gap.FINDING,
        reversal.FINDING,
        pathstar.FINDING,
        adaptation.FINDING,
        sample_quality.FINDING,
        uniform_masked.FINDING,
        eso_alpha.FINDING,
        remdm_steps.FINDING,
    )
}
