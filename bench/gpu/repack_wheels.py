"""Recompress wheels with LZMA, so the wheels an offline GPU machine lacks travel in less space.

A wheel is a zip archive; pip extracts it with Python's zipfile, which reads LZMA members, and
checks the RECORD hashes of the extracted files, which recompression leaves as they were. PyAV's
wheel (its FFmpeg libraries) goes from 35.8 MB to 26.8 MB, the others from 9.6 MB to 7.7 MB.

    python bench/gpu/repack_wheels.py SRC_DIR DST_DIR
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path


def repack(source: Path, target: Path) -> None:
    """Write ``source``'s members to ``target`` LZMA-compressed, names, times and modes kept."""
    with (
        zipfile.ZipFile(source) as zin,
        zipfile.ZipFile(target, "w", compression=zipfile.ZIP_LZMA) as zout,
    ):
        for member in zin.infolist():
            info = zipfile.ZipInfo(member.filename, member.date_time)
            info.external_attr = member.external_attr
            info.compress_type = zipfile.ZIP_LZMA
            zout.writestr(info, zin.read(member))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="folder of wheels")
    parser.add_argument("target", type=Path, help="folder for the recompressed wheels")
    args = parser.parse_args()
    args.target.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(args.source.glob("*.whl")):
        out = args.target / wheel.name
        repack(wheel, out)
        before, after = wheel.stat().st_size / 1e6, out.stat().st_size / 1e6
        print(f"{wheel.name}: {before:.1f} -> {after:.1f} MB")


if __name__ == "__main__":
    main()
