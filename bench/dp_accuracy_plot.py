#!/usr/bin/env python3
"""Test accuracy against rounds for bench/dp_accuracy.sh's runs, as one SVG (docs/privacy-accuracy.svg).

Usage: bench/dp_accuracy_plot.py OUT_DIR SVG   (OUT_DIR holds nodp.csv, eps8.csv, eps4.csv, eps1.csv: round,accuracy,
epsilon). Standard library only: the report tool (fl-report) plots against wall time, not rounds."""
import csv
import os
import sys

SERIES = [("nodp", "no DP", "#000000"), ("eps8", "ε ≈ 8", "#1f77b4"), ("eps4", "ε ≈ 4", "#2ca02c"),
          ("eps1", "ε ≈ 1", "#d62728")]
W, H, L, R, T, B = 700, 400, 60, 160, 30, 50


def main():
    out_dir, svg_path = sys.argv[1], sys.argv[2]
    data = []
    for key, label, colour in SERIES:
        path = os.path.join(out_dir, key + ".csv")
        if not os.path.exists(path):
            continue
        rows = list(csv.DictReader(open(path)))
        points = [(int(r["round"]), float(r["accuracy"])) for r in rows]
        final_eps = next((r["epsilon"] for r in reversed(rows) if r["epsilon"]), "")
        if final_eps:
            label = f"{label}: spent {float(final_eps):.2f}"
        data.append((label, colour, points))
    max_round = max(p[0] for _, _, pts in data for p in pts)

    def x(r):
        return L + (W - L - R) * r / max_round

    def y(a):
        return T + (H - T - B) * (1 - a)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
             f'font-size="12">', f'<rect width="{W}" height="{H}" fill="white"/>',
             f'<text x="{W / 2}" y="18" text-anchor="middle">CNN on Fashion-MNIST, central DP: test accuracy '
             f'against rounds</text>']
    for i in range(11):
        a = i / 10
        parts.append(f'<line x1="{L}" y1="{y(a):.1f}" x2="{W - R}" y2="{y(a):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{L - 6}" y="{y(a) + 4:.1f}" text-anchor="end">{a:.1f}</text>')
    step = 10 if max_round > 20 else 1
    for r in range(0, max_round + 1, step):
        parts.append(f'<text x="{x(r):.1f}" y="{H - B + 16}" text-anchor="middle">{r}</text>')
    parts.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">round</text>')
    parts.append(f'<text x="16" y="{(T + H - B) / 2}" text-anchor="middle" '
                 f'transform="rotate(-90 16 {(T + H - B) / 2})">test accuracy</text>')
    parts.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="#444"/>')
    for i, (label, colour, points) in enumerate(data):
        path = " ".join(f"{x(r):.1f},{y(a):.1f}" for r, a in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        ly = T + 20 + 20 * i
        parts.append(f'<line x1="{W - R + 10}" y1="{ly}" x2="{W - R + 30}" y2="{ly}" stroke="{colour}" '
                     f'stroke-width="2"/>')
        parts.append(f'<text x="{W - R + 34}" y="{ly + 4}">{label}</text>')
    parts.append("</svg>")
    open(svg_path, "w").write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
