"""The environment the Python tests run in, as scripts/test.sh sets it up: the project's own virtual
environment (scripts/python_env.sh, from the pins in requirements/ only) and the copy of the
package that the build under test made. Run outside test.sh (no FUSEKIT_TEST_BUILD), these skip."""

import os
import re
import site
import sys
from importlib import metadata

import pytest

import fusekit

BUILD = os.environ.get("FUSEKIT_TEST_BUILD")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(not BUILD, reason="run by scripts/test.sh only")


def _inside(path, folder):
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder + os.sep)


def _pins(name="test"):
    """{normalized name: version} of requirements/<name>.txt and the files it includes."""
    pins = {}
    with open(os.path.join(ROOT, "requirements", f"{name}.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line.startswith("-r"):
                pins.update(_pins(line[2:].strip()[:-len(".txt")]))
            elif "==" in line:
                pkg, version = line.split("==")
                pins[_norm(pkg)] = version.strip()
    return pins


def _norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def test_a_virtual_environment_that_sees_no_other_site_packages():
    assert sys.prefix != sys.base_prefix, "not a virtual environment"
    assert not site.ENABLE_USER_SITE, "the user's site-packages are visible"
    for p in sys.path:
        if os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            assert _inside(p, sys.prefix), f"{p} is on sys.path, outside {sys.prefix}"


def test_every_installed_package_is_pinned_at_its_pin():
    pins = _pins()
    seen = {}
    # The environment's own site-packages: importing setuptools (torch.testing does) puts its
    # vendored packages (setuptools/_vendor/*.dist-info) on sys.path, which are setuptools', not
    # installed packages.
    site_dirs = [p for p in sys.path if p.endswith("site-packages")]
    for dist in metadata.distributions(path=site_dirs):
        name = _norm(dist.metadata["Name"])
        seen[name] = dist.version
        if name in ("pip", "fusekit"):  # the venv's own installer; the package under test
            continue
        assert name in pins, f"{name} {dist.version} is installed but not pinned in requirements/"
        # torch reports its local build tag (2.15.0+cu132) on top of the pinned release
        assert dist.version.split("+")[0] == pins[name], (name, dist.version, pins[name])
    missing = sorted(set(pins) - set(seen))
    assert not missing, f"pinned but not installed: {missing}"


def test_the_package_is_the_build_under_test():
    assert _inside(fusekit.__file__, BUILD), (fusekit.__file__, BUILD)
    assert _inside(fusekit._fusekit.__file__, BUILD), fusekit._fusekit.__file__
