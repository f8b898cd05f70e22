# The unmodified e2b SDK's Template.build against a worker's build API (test/builds-api.test.ts
# starts the worker with a test engine that records each build's request; the real engine's
# end-to-end run is test/e2b-builds.test.ts). What an E2B user does: build a template from an
# image with copy, env, workdir, user, run, start and ready commands, watch its logs, list,
# tag and delete it; and what another team must not do with it.
import os
import tempfile

import pytest
from e2b import Template, BuildException, FileUploadException
from e2b.api.client.api.templates import get_templates_template_id_files_hash

KEY_A = os.environ["KEY_A"]
KEY_B = os.environ["KEY_B"]
IMAGE = os.environ["BASE_IMAGE"]


def context_dir():
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "hello.txt"), "w") as f:
        f.write("hello from the build context\n")
    return d


def app_template(ctx):
    return (
        Template(file_context_path=ctx)
        .from_image(IMAGE)
        .copy("hello.txt", "/app/hello.txt")
        .set_envs({"GREETING": "hi there"})
        .set_workdir("/app")
        .set_user("nobody")
        .run_cmd("cat /app/hello.txt > /app/copy.txt")
        .set_start_cmd("echo started > /tmp/started; sleep infinity", "test -f /tmp/started")
    )


def test_build_logs_list_and_tags():
    logs = []
    info = Template.build(app_template(context_dir()), "my-env", api_key=KEY_A, on_build_logs=logs.append)
    assert info.template_id and info.build_id
    messages = [str(entry) for entry in logs]
    assert any("Uploaded 'hello.txt'" in m for m in messages), messages
    assert any("step 5: the test engine ran RUN" in m for m in messages), messages
    # A second build of the same name is a new build of the same template; the files are there already.
    logs2 = []
    again = Template.build(app_template(context_dir()), "my-env", api_key=KEY_A, on_build_logs=logs2.append)
    assert again.template_id == info.template_id
    assert again.build_id != info.build_id
    assert any("already cached" in str(m) for m in logs2), [str(m) for m in logs2]

    assert Template.exists("my-env", api_key=KEY_A)
    assert not Template.exists("my-env", api_key=KEY_B), "another team does not see the name"
    tagged = Template.assign_tags("my-env", ["stable"], api_key=KEY_A)
    assert tagged.tags == ["stable"]
    tags = [t.tag for t in Template.get_tags(info.template_id, api_key=KEY_A)]
    assert "stable" in tags


def test_another_team_cannot_read_build_or_files():
    info = Template.build(app_template(context_dir()), "private-env", api_key=KEY_A)
    from e2b.template.types import BuildInfo  # noqa: F401
    with pytest.raises(Exception) as err:
        Template.get_build_status(info, api_key=KEY_B)
    assert "not found" in str(err.value).lower() or "404" in str(err.value)
    # Team B building on team A's template fails: the name does not resolve for B.
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_template(info.template_id).run_cmd("true"), "stolen", api_key=KEY_B)
    assert "fromTemplate" in str(err.value)


def test_a_failing_step_names_it():
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(IMAGE).run_cmd("true").run_cmd("exit 3"), "failing", api_key=KEY_A)
    assert "step 2" in str(err.value)
