"""scripts/results_table.py: the README's and docs/results.md's tables match benchmarks/results/*.json."""

import json
import shutil
from pathlib import Path

import pytest

from script_module import script_module

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def results_table():
    yield from script_module("scripts/results_table.py", "results_table")


def copy_results(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    out.mkdir()
    for path in RESULTS.glob("*.json"):
        shutil.copy(path, out / path.name)
    return out


def copy_pages(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    shutil.copy(ROOT / "README.md", root / "README.md")
    shutil.copy(ROOT / "docs" / "results.md", root / "docs" / "results.md")
    return root


def test_repo_tables_match_the_json_files(results_table, capsys):
    assert results_table.main(results_table.Args(check=True)) == 0, capsys.readouterr().out


def test_readme_is_a_short_user_guide():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_a_changed_number_fails_the_check_and_names_the_file(results_table, tmp_path, capsys):
    results = copy_results(tmp_path)
    data = json.loads((results / "compare_state.json").read_text())
    row = next(r for r in data["results"] if r["policy"] == "diffusion")
    row["success_rate"] = 0.95
    (results / "compare_state.json").write_text(json.dumps(data))
    before = (ROOT / "README.md").read_text()

    assert results_table.main(results_table.Args(check=True, results=results)) == 1
    message = capsys.readouterr().out.strip()
    assert len(message.splitlines()) == 1
    assert "README.md" in message
    assert (ROOT / "README.md").read_text() == before  # check mode writes nothing


def test_rewrite_fixes_the_regions_and_leaves_the_rest(results_table, tmp_path):
    results = copy_results(tmp_path)
    data = json.loads((results / "rl_offline.json").read_text())
    next(r for r in data["results"] if r["algo"] == "bc")["success_rate"] = 0.5
    (results / "rl_offline.json").write_text(json.dumps(data))
    root = copy_pages(tmp_path)
    outside = (root / "README.md").read_text().split("<!-- results:headline:begin -->")[0]

    assert results_table.main(results_table.Args(check=True, root=root, results=results)) == 1
    assert results_table.main(results_table.Args(root=root, results=results)) == 0
    assert results_table.main(results_table.Args(check=True, root=root, results=results)) == 0
    readme = (root / "README.md").read_text()
    assert "| BC (diffusion) | 50.0% [" in readme
    assert readme.startswith(outside)


def test_a_missing_region_is_an_error_naming_the_file(results_table, tmp_path):
    root = copy_pages(tmp_path)
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("<!-- results:headline:end -->", ""))
    with pytest.raises(ValueError, match="README.md"):
        results_table.main(results_table.Args(check=True, root=root, results=RESULTS))
