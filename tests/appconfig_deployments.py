"""AppConfig's deployments, which moto does not have (it keeps applications, profiles and hosted versions only).

``Deployments.attach(client)`` answers StartDeployment, ListDeployments and GetDeployment on that client (botocore's
``before-send``, so nothing reaches moto for them) as AppConfig does for an immediate strategy: a deployment is
COMPLETE at once, and its version, read back from moto's hosted versions, is what the local agent then serves (the
flag's values alone, as the agent and the Lambda extension serve a feature-flag profile). ``busy`` makes the next
StartDeployment answer ConflictException, as AppConfig does while another deployment is in progress.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

from botocore.awsrequest import AWSResponse
from urllib3.response import HTTPResponse

from cleanup.operations.switch import served
from worker.local.appconfig import LocalAgent

_PATH = re.compile(r"/applications/([^/]+)/environments/([^/]+)/deployments(?:/(\d+))?$")


class Deployments:
    """The environment's deployments, and the agent that serves the last one's flag."""

    def __init__(self, agent: LocalAgent, versions: Any) -> None:
        """``versions``: an AppConfig client of moto's, to read a deployed hosted version with."""
        self.agent = agent
        self.versions = versions
        self.made: list[dict[str, Any]] = []
        self.busy = False

    def attach(self, client: Any) -> Any:
        for operation in ("StartDeployment", "ListDeployments", "GetDeployment"):
            client.meta.events.register(f"before-send.appconfig.{operation}", self._answer)
        return client

    def _answer(self, request: Any, **_: Any) -> AWSResponse:
        path = request.url.split("://", 1)[1].split("/", 1)[1].split("?")[0]
        match = _PATH.search("/" + path)
        assert match, request.url
        application, environment, number = match.groups()
        if request.method == "POST":
            return self._start(request, application, environment)
        if number is None:
            summaries = [{k: d[k] for k in ("DeploymentNumber", "ConfigurationVersion", "State")} for d in self.made]
            return _response(200, {"Items": summaries[::-1]})
        [found] = [d for d in self.made if d["DeploymentNumber"] == int(number)]
        return _response(200, found)

    def _start(self, request: Any, application: str, environment: str) -> AWSResponse:
        if self.busy:
            self.busy = False
            return _response(409, {"Message": "Deployment in progress"}, error="ConflictException")
        body = json.loads(request.body)
        version = int(body["ConfigurationVersion"])
        content = self.versions.get_hosted_configuration_version(
            ApplicationId=application, ConfigurationProfileId=body["ConfigurationProfileId"], VersionNumber=version
        )["Content"].read()
        self.agent.serve(served(content))  # an immediate strategy: every target has it at once
        deployment = {
            "ApplicationId": application,
            "EnvironmentId": environment,
            "ConfigurationProfileId": body["ConfigurationProfileId"],
            "DeploymentStrategyId": body["DeploymentStrategyId"],
            "ConfigurationVersion": str(version),
            "DeploymentNumber": len(self.made) + 1,
            "State": "COMPLETE",
        }
        self.made.append(deployment)
        return _response(201, deployment)


def _response(status: int, body: dict[str, Any], error: str | None = None) -> AWSResponse:
    headers = {"Content-Type": "application/json", **({"x-amzn-ErrorType": error} if error else {})}
    data = json.dumps(body).encode()
    raw = HTTPResponse(body=io.BytesIO(data), status=status, headers=headers, preload_content=False)
    return AWSResponse("http://appconfig.local", status, headers, raw)
