"""The benchmark tools' usage errors, as their tests check them: argparse's exit code 2, the
message on stderr, and no output file written."""
import pytest


def usage_error(main, tmp_path, capsys, *args) -> str:
    """Run ``main(["--out", <tmp>/x.json, *args])``; assert it exits 2 and writes no file;
    return what it printed on stderr."""
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--out", str(out), *args])
    assert exit_info.value.code == 2
    assert not out.exists()
    return capsys.readouterr().err
