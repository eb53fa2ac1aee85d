"""deploy/template.yaml around the message path: the layer that runs as the grants' retiring principal is AWS's own,
no queue takes another's dead letters, nothing travels in plain HTTP, dead letters live in a bucket of their own under
a key of the stack's, and each function of the retiring principal's role is allowed only its own calls."""

from __future__ import annotations

import re

import pytest

from tests.test_template import parameter

# AWS's AppConfig extension layers, as AWS AppConfig's user guide lists them ("Available versions of the AWS
# AppConfig Agent Lambda extension"): the account differs by Region.
APPCONFIG_LAYERS = [
    "arn:aws:lambda:us-east-1:027255383542:layer:AWS-AppConfig-Extension-Arm64:61",
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension-Arm64:243",
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension:305",
    "arn:aws:lambda:ap-southeast-2:080788657173:layer:AWS-AppConfig-Extension-Arm64:49",
    "arn:aws-cn:lambda:cn-north-1:615057806174:layer:AWS-AppConfig-Extension:76",
    "arn:aws-us-gov:lambda:us-gov-west-1:946746059096:layer:AWS-AppConfig-Extension:54",
    "",
]
NOT_APPCONFIG_LAYERS = [
    "arn:aws:lambda:eu-west-1:123456789012:layer:AWS-AppConfig-Extension-Arm64:63",  # someone else's account
    "arn:aws:lambda:us-east-1:434848589818:layer:AWS-AppConfig-Extension-Arm64:63",  # another Region's account
    "arn:aws:lambda:eu-west-1:434848589818:layer:my-extension:1",
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension-Arm64",  # no version
    "arn:aws:lambda:eu-west-1:434848589818:layer:AWS-AppConfig-Extension-Arm64:1,arn:aws:lambda:x",
]


@pytest.mark.parametrize("arn", APPCONFIG_LAYERS)
def test_the_extension_layer_may_be_one_of_awss_appconfig_layers_or_none(arn: str) -> None:
    assert re.fullmatch(parameter("AppConfigExtensionLayerArn")["AllowedPattern"], arn)


@pytest.mark.parametrize("arn", NOT_APPCONFIG_LAYERS)
def test_no_other_layer_runs_as_the_grants_retiring_principal(arn: str) -> None:
    assert not re.fullmatch(parameter("AppConfigExtensionLayerArn").get("AllowedPattern", ".*"), arn)
