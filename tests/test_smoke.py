from conftest import run


def test_two_sites_converge_through_the_cli(tmp_path):
    a, b, usb = tmp_path / "a", tmp_path / "b", tmp_path / "usb"
    assert run("init", a, "--family", "f", "--site", "a").code == 0
    r = run("keygen", b, "--site", "b", json_mode=True)
    assert r.code == 0 and r.json["site"] == "b"
    assert run("mkreplica", "export", "--site", "b", "--pubkey", r.json["public_key"],
               "--create-out", "--out", usb, site=a).code == 0
    assert run("mkreplica", "import", usb, site=b).code == 0
    run("put", "c", "k1", '{"v": 1}', site=a)
    run("put", "c", "k2", '"two"', site=b)
    e = run("export", "--to", "b", "--create-out", "--out", usb / "x", site=a, json_mode=True)
    assert e.code == 0, e
    assert run("import", usb / "x", site=b).code == 0
    run("export", "--to", "a", "--create-out", "--out", usb / "y", site=b)
    assert run("import", usb / "y", site=a).code == 0
    da = run("digest", site=a, json_mode=True).json
    db = run("digest", site=b, json_mode=True).json
    assert da == db and da["records"] == 2
