# The unmodified e2b SDK builds templates on the whole local system with the real build engine
# (test/e2b-builds.test.ts starts it): steps and a Dockerfile become images in the local registry,
# sandboxes start from them by name with the copied files, env, workdir, user and a running start
# command; a rebuild comes from the cache; another team can neither use nor build on them.
import os
import tempfile
import time

import pytest
from e2b import Sandbox, Template, BuildException

KEY_A = os.environ["KEY_A"]
KEY_B = os.environ["KEY_B"]

START = 'pwd > /tmp/started; id -un >> /tmp/started; echo "$GREETING" >> /tmp/started; while true; do date +%s%N > /tmp/alive; sleep 0.2; done'


def context_dir():
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "hello.txt"), "w") as f:
        f.write("hello from the build context\n")
    return d


def app_template():
    return (
        Template(file_context_path=context_dir())
        .from_image("debian:12")
        .copy("hello.txt", "/app/hello.txt")
        .run_cmd("cat /app/hello.txt > /app/copy.txt && echo built-ok")
        # As E2B's build reads a value: $VAR and ${VAR:-x} expand from the image's env, \$ is a literal $.
        .set_envs({"GREETING": "hi there", "MORE_PATH": "$PATH:/extra", "LITERAL": "\\$PATH ${NOPE:-dflt}"})
        .set_workdir("/app")
        .set_user("nobody")
        .set_start_cmd(START, "test -s /tmp/alive")
    )


def test_build_then_start_by_name():
    logs = []
    Template.build(app_template(), "app-env", api_key=KEY_A, on_build_logs=logs.append)
    text = "\n".join(str(e) for e in logs)
    assert "built-ok" in text, text

    sbx = Sandbox.create("app-env", api_key=KEY_A)
    try:
        assert sbx.commands.run("cat /app/hello.txt").stdout == "hello from the build context\n"
        assert sbx.commands.run("cat /app/copy.txt").stdout == "hello from the build context\n"
        assert sbx.commands.run('echo "$GREETING"').stdout.strip() == "hi there"
        assert sbx.commands.run('echo "$MORE_PATH"').stdout.strip() == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/extra"
        assert sbx.commands.run('echo "$LITERAL"').stdout.strip() == "$PATH dflt"
        assert sbx.commands.run("id -un").stdout.strip() == "nobody"
        # The start command ran in the workdir, as the user, with the env, and runs on.
        assert sbx.commands.run("cat /tmp/started").stdout.split("\n")[:3] == ["/app", "nobody", "hi there"]
        first = sbx.commands.run("cat /tmp/alive").stdout
        time.sleep(1)
        assert sbx.commands.run("cat /tmp/alive").stdout != first, "the start command keeps running"
    finally:
        sbx.kill()

    # The same template again: every step from the cache.
    again = []
    Template.build(app_template(), "app-env", api_key=KEY_A, on_build_logs=again.append)
    cached = [str(e) for e in again if "CACHED" in str(e)]
    assert len(cached) >= 2, "\n".join(str(e) for e in again)


def test_dockerfile_template():
    dockerfile = "FROM debian:12\nRUN echo from-dockerfile > /dock.txt\nENV COLOR=blue\nWORKDIR /srv\n"
    Template.build(Template().from_dockerfile(dockerfile), "dock-env", api_key=KEY_A)
    sbx = Sandbox.create("dock-env", api_key=KEY_A)
    try:
        assert sbx.commands.run("cat /dock.txt").stdout == "from-dockerfile\n"
        assert sbx.commands.run('echo "$COLOR"').stdout.strip() == "blue"
        # The SDK's parser ends a Dockerfile with E2B's defaults: USER user, WORKDIR /home/user.
        assert sbx.commands.run("id -un").stdout.strip() == "user"
        assert sbx.commands.run("touch /home/user/mine && stat -c %U /home/user/mine").stdout.strip() == "user"
    finally:
        sbx.kill()


def test_another_team_cannot_use_or_build_on_it():
    with pytest.raises(Exception) as err:
        Sandbox.create("app-env", api_key=KEY_B)
    assert "not found" in str(err.value).lower()
    assert not Template.exists("app-env", api_key=KEY_B)
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_template("app-env").run_cmd("cat /app/hello.txt"), "stolen", api_key=KEY_B)
    assert "fromTemplate" in str(err.value)


def test_failing_step_shows_its_output():
    logs = []
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image("debian:12").run_cmd("echo about-to-fail; exit 7"), "broken", api_key=KEY_A, on_build_logs=logs.append)
    assert "step 1" in str(err.value), str(err.value)
    assert "about-to-fail" in "\n".join(str(e) for e in logs)


def test_tags_pin_builds():
    def versioned(version):
        return Template().from_image("debian:12").run_cmd(f"echo {version} > /version")

    Template.build(versioned("one"), "tag-env:v1", api_key=KEY_A)
    Template.build(versioned("two"), "tag-env:v2", api_key=KEY_A)

    def version_of(name):
        sbx = Sandbox.create(name, api_key=KEY_A)
        try:
            return sbx.commands.run("cat /version").stdout.strip()
        finally:
            sbx.kill()

    # v1 still starts v1's build after v2 was built; the name alone is the newest.
    assert version_of("tag-env:v1") == "one"
    assert version_of("tag-env:v2") == "two"
    assert version_of("tag-env") == "two"
    # Moving v1 to v2's build moves what tag-env:v1 starts.
    moved = Template.assign_tags("tag-env:v2", "v1", api_key=KEY_A)
    assert moved.tags == ["v1"]
    assert version_of("tag-env:v1") == "two"
    with pytest.raises(Exception) as err:
        Sandbox.create("tag-env:v1", api_key=KEY_B)
    assert "not found" in str(err.value).lower()
