"""The report of two compared run records: one line for the console, Markdown, and a plot of each layer's largest
gradient difference over the steps (relative, log scale, the tolerance drawn)."""

from __future__ import annotations

from pathlib import Path

from .record_comparison import Comparison

FORWARD_BY_MODULE = "module by module (rank 0's first micro-batch of each step)"
FORWARD_BY_LOSS = "by the loss (module outputs need both runs in PyTorch, with the same ranks and accumulation)"


def describe_run(run: dict) -> str:
    return (
        f"{run['backend']}, ZeRO-{run['zero_stage']}, {run['world_size']} rank(s) x "
        f"{run['gradient_accumulation_steps']} accumulation, {run['precision']}"
    )


def verdict_line(comparison: Comparison) -> str:
    parting = comparison.parting
    steps = f"{len(comparison.steps)} steps"
    if parting is None:
        return f"[compare] AGREE over {steps} within {comparison.tolerance:g} (relative)"
    what = "the loss" if parting.tensor == "loss" else f"{parting.tensor} (layer {parting.layer})"
    return (
        f"[compare] PART at step {parting.step}, in the {parting.part}: {what} differs by {parting.difference:.3g} "
        f"(relative; tolerance {comparison.tolerance:g})"
    )


def markdown(comparison: Comparison, plot: Path | None) -> str:
    a, b = comparison.a, comparison.b
    lines = [
        "# Run comparison",
        "",
        f"- A: `{a.path}` ({describe_run(a.run)})",
        f"- B: `{b.path}` ({describe_run(b.run)})",
        f"- tolerance: {comparison.tolerance:g}, relative to each tensor's scale ("
        + ("given" if comparison.given else f"from the precisions, {a.run['precision']} and {b.run['precision']}")
        + ")",
        f"- the forward: {FORWARD_BY_MODULE if comparison.activations else FORWARD_BY_LOSS}",
        f"- verdict: {verdict_line(comparison).removeprefix('[compare] ')}",
        "",
        "| step | loss A | loss B | largest gradient difference | its layer |",
        "|---:|---:|---:|---:|---|",
    ]
    for index, step in enumerate(comparison.steps):
        layer, worst = max(((name, series[index]) for name, series in comparison.by_layer.items()), key=lambda t: t[1])
        lines.append(f"| {step} | {a.steps[step]['loss']:.6f} | {b.steps[step]['loss']:.6f} | {worst:.3g} | {layer} |")
    if plot is not None:
        lines += ["", f"![each layer's gradient difference over the steps]({plot.name})"]
    return "\n".join(lines) + "\n"


def write(comparison: Comparison, markdown_path: Path) -> None:
    """The Markdown report at `markdown_path`, its plot beside it (the same name, `.png`)."""
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    plot = markdown_path.with_suffix(".png")
    draw(comparison, plot)
    markdown_path.write_text(markdown(comparison, plot), encoding="utf-8")


def draw(comparison: Comparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    floor = comparison.tolerance * 1e-6  # equal statistics would vanish on a log scale
    for layer, series in comparison.by_layer.items():
        axes.plot(comparison.steps, [max(value, floor) for value in series], label=layer)
    axes.axhline(comparison.tolerance, color="black", linestyle="--", label="tolerance")
    axes.set(yscale="log", xlabel="step", ylabel="largest relative gradient difference")
    axes.legend(fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
