"""The reference model's learning curve, for people to look at (`python -m lab train-reference` draws it; the
captioned sample grids are ssdgen.reference.grid's)."""

from __future__ import annotations


def learning_curve_plot(curve: list[dict], path, budget_note: str = "") -> None:
    """Object and scene accuracy (AR, CFG 3, on the curve's eval prompts) against samples seen, with the
    issue's bars, so the next person sees whether more training would still pay."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.8))
    x = [p["samples_seen"] for p in curve]
    ax.plot(x, [p["object_accuracy"] for p in curve], "o-", label="object accuracy")
    ax.plot(x, [p["scene_accuracy"] for p in curve], "s-", label="scene accuracy")
    for y, style, label in ((0.70, ":", "bar: object 0.70"), (0.40, "--", "bar: scene 0.40")):
        ax.axhline(y, color="#888", ls=style, lw=1, label=label)
    ax.set_xlabel("training samples seen")
    ax.set_ylabel(f"accuracy on {curve[0]['n'] if curve else 0} eval prompts")
    ax.set_ylim(0, 1)
    ax.set_title("reference model v2: learning curve" + (f" ({budget_note})" if budget_note else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
