

def test_scrub_resync_and_log_export_show_bars(world, tmp_path):
    from syncpack import sync
    from syncpack.site import Site
    boston = copy_site(world, "boston", tmp_path)
    sanfran = copy_site(world, "sanfran", tmp_path)
    # sanfran applies everything and acknowledges it, so boston may trim it all.
    with Site.open(sanfran) as s:
        sync.import_packets(s, [world["small"], world["big"]])
    back = tmp_path / "back"
    back.mkdir()
    with Site.open(sanfran) as s:
        sync.export(s, back, to=["boston"])
    with Site.open(boston) as s:
        sync.import_packets(s, [back])

    code, out, err = Terminal(["--site", boston, "log", "export"], tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "log")), err[-2000:]

    usb = tmp_path / "usb"
    usb.mkdir()
    code, out, err = Terminal(["--site", boston, "resync", "--to", "sanfran", "--out", usb],
                              tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "snapshot")), err[-2000:]

    code, out, err = Terminal(["--site", boston, "scrub"], tmp_path).finish()
    assert code == 0, err
    assert any(t >= BIG for _p, _n, t in bars(err, "scrub")), err[-2000:]
    assert f"removed {BIG + 1} changelog op(s)" in out or "removed" in out, out
    assert run("fsck", site=boston).code == 0
