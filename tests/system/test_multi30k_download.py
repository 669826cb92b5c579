"""System test (slow: preparing the whole of Multi30k En-De, about a minute on 2 busy cores): with no local copy of
Multi30k, `rpr-mt train --config configs/multi30k_en_de_lit.yaml` downloads the files it needs (here from a mirror on
127.0.0.1, as RPR_MT_MULTI30K_URL allows), prepares them and trains, with no other step.

    python3 -m pytest -m slow tests/system/test_multi30k_download.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rpr_mt.data import multi30k
from tests.data.multi30k_mirror import PROXY_VARIABLES, MirrorServer, build_mirror

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_literature_recipe_trains_from_the_download_to_its_first_update(multi30k_dir, tmp_path):
    mirror = build_mirror(multi30k_dir, tmp_path / "mirror")
    env = {key: value for key, value in os.environ.items() if key not in (multi30k.DIR_ENV, *PROXY_VARIABLES)}
    env.update(XDG_CACHE_HOME=str(tmp_path / "xdg"), PYTHONPATH=str(REPO))
    work = tmp_path / "clone"  # the working directory: nothing beside it (no ../shared)
    work.mkdir()
    with MirrorServer(mirror) as server:
        env[multi30k.URL_ENV] = server.url
        done = subprocess.run(
            [sys.executable, "-m", "rpr_mt.cli", "train", "--config", str(REPO / "configs" / "multi30k_en_de_lit.yaml"),
             "--set", "train.max_steps=1", "--set", "data.output_dir=data", "--set", "train.run_dir=run"],
            cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert f"downloading 6 Multi30k files (4.3 MB) from {server.url} into " in output
    assert "\nupdate 1 | epoch 1 | loss " in output and "stopped by max_steps at update 1" in output
    tok_en_de = {multi30k.upstream_name(prefix, lang, "tok") for prefix in multi30k.PREFIXES.values()
                 for lang in ("en", "de")}
    casing_source = multi30k.upstream_name(multi30k.PREFIXES["train"], "de", "raw")  # the casing model learns from it
    assert sorted(server.requests) == sorted(tok_en_de | {casing_source})
    manifest = json.loads((work / "data" / "manifest.json").read_text())
    assert manifest["inputs"]["multi30k"]["from"] == "download"
    assert manifest["splits"]["train"]["read"] == 29000
    assert (work / "run" / "checkpoints" / "checkpoint_00000001.pt").is_file()
