"""The README's GIFs: each committed skill bundle (bench/results/skills/) on its robot, filmed by
`q2real render` (the bundle through onnxruntime, one seeded episode of the env it trained on).

Writes bench/results/videos/<skill>.gif (320x240, 12.5 fps, a few seconds: well under 2 MB each) and
prints each one's size and the filmed episode's return. Seeds are picked to show the skill: the push
episode is one the policy wins (it wins about 60 % of them, `bench/skills.py`).

Results: docs/results/skills.md
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from q2real.gate.render import RenderSettings, render

RESULTS = Path(__file__).resolve().parent / "results"
SKILLS = {
    # bundle -> (seconds, seed): Spot through a joystick command change (every 5 s), the GR1 standing
    # through a shove, a whole push episode (4 s).
    "spot_joystick": (8.0, 12345),
    "gr1_stand": (6.0, 12345),
    "panda_push": (4.0, 6),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "videos")
    parser.add_argument("--only", nargs="+", choices=sorted(SKILLS), default=sorted(SKILLS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        seconds, seed = SKILLS[name]
        settings = RenderSettings(seconds=seconds, seed=seed, width=320, height=240, gif=True)
        with tempfile.TemporaryDirectory() as tmp:
            result = render(RESULTS / "skills" / f"{name}.onnx", Path(tmp) / f"{name}.mp4", settings)
            assert result.gif is not None
            gif = args.out / f"{name}.gif"
            shutil.copyfile(result.gif, gif)
        print(f"{gif}: {gif.stat().st_size / 1e6:.2f} MB, {seconds:g} s, episode return {float(result.returns[0]):.1f}")


if __name__ == "__main__":
    main()
