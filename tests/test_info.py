"""`mirrorkit info` says whether the installed TensorFlow/Keras pair is inside the tested range."""

import json

from mirrorkit import info, versions


def test_info_text_and_json_say_inside_the_tested_range(mirrorkit_command, capsys):
    # `mirrorkit info --json` in this process; tests/test_fresh_process.py runs it as a command.
    code = mirrorkit_command("info", "--json")
    out, err = capsys.readouterr()
    assert code == 0, err
    facts = json.loads(out)
    tested = facts["tested_range"]
    assert tested["inside"] is True
    assert tested["range"] == versions.tested_range()
    assert tested["describe"] == versions.installed().describe()
    line = [x for x in info.format_text(facts).splitlines() if x.startswith("tested range")]
    assert line and "inside the tested range" in line[0]


def test_info_text_says_outside_the_tested_range(monkeypatch):
    monkeypatch.setattr(versions, "installed", lambda: versions.Installed("2.16.1", "3.8.0"))
    facts = info.collect()
    assert facts["tested_range"]["inside"] is False
    (line,) = [x for x in info.format_text(facts).splitlines() if x.startswith("tested range")]
    assert "TensorFlow 2.16.1, Keras 3.8.0: OUTSIDE the tested range" in line
    assert versions.tested_range() in line
