"""An agent's system prompt from MLflow's prompt registry, so that a prompt the optimiser
registered (`tracetrain optimize-prompt`) reaches the agents by moving an alias:

    text = load_prompt("prompts:/calc-system@production", tracking_uri="http://127.0.0.1:5000")
"""

from __future__ import annotations

from examples.errors import ExamplesError


def load_prompt(uri: str, tracking_uri: str | None = None) -> str:
    """The template of the prompt version `uri` names (`prompts:/NAME@ALIAS` or
    `prompts:/NAME/VERSION`)."""
    if not uri.startswith("prompts:/"):
        raise ExamplesError(f"prompt {uri!r}: expected prompts:/NAME@ALIAS or prompts:/NAME/VERSION")
    import mlflow

    if tracking_uri is not None:
        mlflow.set_tracking_uri(tracking_uri)
    try:
        # link_to_model: a plain load, not one inside a logged model's run
        version = mlflow.genai.load_prompt(uri, link_to_model=False)
    except mlflow.exceptions.MlflowException as exc:
        raise ExamplesError(f"prompt {uri!r} is not in MLflow's prompt registry at "
                            f"{mlflow.get_tracking_uri()}: {exc.message}") from exc
    if not isinstance(version.template, str) or not version.template.strip():
        raise ExamplesError(f"prompt {uri!r}: expected a non-empty text template")
    return version.template
