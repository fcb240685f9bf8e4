"""Print the installed transformers' fingerprints of the code ort_zero's export rewrites replace, as entries of
`ort_zero.foreign.fingerprints.TESTED_SOURCES`: add them there once that transformers release is tested.

    python -m ort_zero.tools.fingerprints
"""

from __future__ import annotations

from importlib.metadata import version

from .. import patches


def main() -> None:
    print(f"# transformers {version('transformers')}")
    for patch in patches.registered():
        if patch.distribution == "transformers":
            print(f'    "{patch.name}": ("{patches.fingerprint(patch.current())}",),')


if __name__ == "__main__":
    main()
