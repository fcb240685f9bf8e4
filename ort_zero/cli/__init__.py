"""Command-line front ends (`ort-zero doctor|compare|converge`); library code never imports this package."""
