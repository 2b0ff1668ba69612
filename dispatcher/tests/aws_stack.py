#!/usr/bin/env python3
"""The CloudFormation stack under test (aws_stack.rs drives this file).

  check TEMPLATE [--policy-json FILE]   least-privilege checks; exit 1 listing each problem
  self-test TEMPLATE                    every check catches a template broken on purpose
  deploy TEMPLATE --endpoint URL ...    the stack into moto_server, then uploads; prints JSON

Templates are read with cfn-lint's decoder, which understands the short tags (!Ref, !Sub...).
"""

import argparse
import base64
import copy
import fnmatch
import importlib
import json
import re
import sys
import time

from cfnlint.decode import decode_str

NO_VALUE = {"Ref": "AWS::NoValue"}

# Resource types moto 5.2.5's CloudFormation cannot create (it logs "No Moto CloudFormation
# support" and skips them, so anything referring to them breaks). The deploy step removes them
# from its copy of the template; cfn-lint and the checks below still cover them.
MOTO_LACKS = {
    "AWS::SQS::QueuePolicy",
    "AWS::S3::BucketPolicy",
    "AWS::AutoScaling::ScalingPolicy",
    "AWS::SNS::Subscription",
    "AWS::CloudWatch::Alarm",
}

# Actions without resource-level permissions: Resource "*" is the only form AWS accepts.
STAR_RESOURCE_OK = {"cloudwatch:PutMetricData", "ecr:GetAuthorizationToken"}


def load(path):
    with open(path, encoding="utf-8") as f:
        template, matches = decode_str(f.read())
    if matches:
        raise SystemExit(f"{path}: {[str(m) for m in matches]}")
    # Plain dicts and lists (the decoder's node classes carry line marks).
    return json.loads(json.dumps(template))


def as_list(value):
    return value if isinstance(value, list) else [value]


def branches(item):
    """Both outcomes of a statement-level Fn::If (the NoValue side dropped)."""
    if isinstance(item, dict) and set(item) == {"Fn::If"}:
        _, yes, no = item["Fn::If"]
        return [b for side in (yes, no) if side != NO_VALUE for b in branches(side)]
    return [item]


def statements(document):
    return [s for item in as_list(document.get("Statement", [])) for s in branches(item)]


def resources_of(template, kind):
    return {k: r for k, r in template.get("Resources", {}).items() if r.get("Type") == kind}


def statement_problems(stmt, where):
    """Least-privilege problems of one Allow statement of the consumer's policy."""
    if stmt.get("Effect") != "Allow":
        return []
    sid = f"{where}/{stmt.get('Sid', '?')}"
    actions = as_list(stmt.get("Action", []))
    resources = as_list(stmt.get("Resource", []))
    problems = []
    if "NotAction" in stmt or "NotResource" in stmt:
        problems.append(f"{sid}: NotAction/NotResource grants more than it names")
    for action in actions:
        if not isinstance(action, str):
            problems.append(f"{sid}: action {action!r} is not a literal")
        elif "*" in action or "?" in action:
            problems.append(f"{sid}: wildcard action {action}")
        elif fnmatch.fnmatch("sqs:sendmessage", action.lower()) or action.lower().startswith(
            "sqs:sendmessage"
        ):
            problems.append(f"{sid}: consumers must not send messages ({action})")
    if "*" in resources:
        extra = [a for a in actions if a not in STAR_RESOURCE_OK]
        if extra:
            problems.append(f"{sid}: Resource \"*\" for {extra}")
        if "cloudwatch:PutMetricData" in actions:
            cond = stmt.get("Condition", {}).get("StringEquals", {})
            if "cloudwatch:namespace" not in cond:
                problems.append(f"{sid}: PutMetricData on \"*\" without a cloudwatch:namespace condition")
    kms = [a for a in actions if isinstance(a, str) and a.lower().startswith("kms:")]
    if kms and not all(key_reference(r) for r in resources):
        problems.append(f"{sid}: {kms} on {resources}, not only on the key")
    return problems


def key_reference(resource):
    """The KMS key parameter, or a literal key ARN (the standalone JSON policy's placeholder)."""
    if resource == {"Ref": "KmsKeyArn"}:
        return True
    return isinstance(resource, str) and ":key/" in resource and "*" not in resource


def instance_roles(template):
    """Logical ids of the roles the instance profiles hand to instances."""
    roles = set()
    for profile in resources_of(template, "AWS::IAM::InstanceProfile").values():
        for role in profile.get("Properties", {}).get("Roles", []):
            if isinstance(role, dict) and "Ref" in role:
                roles.add(role["Ref"])
    return roles


def attached_policies(template, role):
    """(name, document) of every policy the role carries: inline, managed by reference, and
    AWS::IAM::Policy / ManagedPolicy resources listing the role."""
    props = template["Resources"][role].get("Properties", {})
    docs = [(f"{role}/{p.get('PolicyName')}", p["PolicyDocument"]) for p in props.get("Policies", [])]
    managed_refs = set()
    for arn in props.get("ManagedPolicyArns", []):
        for option in branches(arn):
            if isinstance(option, dict) and "Ref" in option:
                managed_refs.add(option["Ref"])
    for kind in ("AWS::IAM::ManagedPolicy", "AWS::IAM::Policy"):
        for name, res in resources_of(template, kind).items():
            p = res.get("Properties", {})
            if name in managed_refs or {"Ref": role} in p.get("Roles", []):
                docs.append((name, p["PolicyDocument"]))
    return docs


def sends_messages(document):
    return any(
        isinstance(a, str) and fnmatch.fnmatch("sqs:sendmessage", a.lower())
        for s in statements(document)
        if s.get("Effect") == "Allow"
        for a in as_list(s.get("Action", []))
    )


def parameter_floor(template, value):
    """The smallest value a number (or a Ref to a Number parameter) can take."""
    if isinstance(value, dict) and "Ref" in value:
        param = template.get("Parameters", {}).get(value["Ref"], {})
        floor = param.get("MinValue")
        default = param.get("Default")
        if floor is None or default is None:
            return None
        return min(float(floor), float(default))
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def denies_insecure_transport(document):
    for s in statements(document):
        bool_cond = s.get("Condition", {}).get("Bool", {})
        actions = as_list(s.get("Action", []))
        if (
            s.get("Effect") == "Deny"
            and s.get("Principal") in ("*", {"AWS": "*"})
            and str(bool_cond.get("aws:SecureTransport")).lower() == "false"
            and any(a in ("s3:*", "sqs:*", "*") for a in actions)
        ):
            return True
    return False


def denies_put_without_kms(document):
    for s in statements(document):
        cond = s.get("Condition", {}).get("StringNotEquals", {})
        if (
            s.get("Effect") == "Deny"
            and "s3:PutObject" in as_list(s.get("Action", []))
            and cond.get("s3:x-amz-server-side-encryption") == "aws:kms"
        ):
            return True
    return False


def check_template(template):
    problems = []
    roles = instance_roles(template)
    if not roles:
        problems.append("no instance profile with a role")
    for role in sorted(roles):
        for name, doc in attached_policies(template, role):
            for stmt in statements(doc):
                problems += statement_problems(stmt, name)
    producers = [
        name
        for name, res in resources_of(template, "AWS::IAM::ManagedPolicy").items()
        if sends_messages(res["Properties"]["PolicyDocument"])
    ]
    if not producers:
        problems.append("no producer managed policy granting sqs:SendMessage")
    for role in roles:
        attached = {name for name, _ in attached_policies(template, role)}
        for producer in producers:
            if producer in attached:
                problems.append(f"producer policy {producer} is attached to instance role {role}")
    queues = resources_of(template, "AWS::SQS::Queue")
    if not any("RedrivePolicy" in q.get("Properties", {}) for q in queues.values()):
        problems.append("no queue has a RedrivePolicy")
    for name, queue in queues.items():
        redrive = queue.get("Properties", {}).get("RedrivePolicy")
        if redrive is not None:
            floor = parameter_floor(template, redrive.get("maxReceiveCount"))
            if floor is None or floor < 3:
                problems.append(f"{name}: maxReceiveCount can be below 3 ({floor})")
    buckets = resources_of(template, "AWS::S3::Bucket")
    policies = resources_of(template, "AWS::S3::BucketPolicy").values()
    for bucket in buckets:
        docs = [
            p["Properties"]["PolicyDocument"]
            for p in policies
            if p["Properties"].get("Bucket") == {"Ref": bucket}
        ]
        if not any(denies_insecure_transport(d) for d in docs):
            problems.append(f"{bucket}: no bucket policy denies non-TLS access")
        if not any(denies_put_without_kms(d) for d in docs):
            problems.append(f"{bucket}: no bucket policy denies PutObject without SSE-KMS")
    for name, qp in resources_of(template, "AWS::SQS::QueuePolicy").items():
        for s in statements(qp["Properties"]["PolicyDocument"]):
            if s.get("Effect") == "Allow" and s.get("Principal") == {"Service": "s3.amazonaws.com"}:
                cond = json.dumps(s.get("Condition", {}))
                if "aws:SourceArn" not in cond or "aws:SourceAccount" not in cond:
                    problems.append(f"{name}: S3 may send without aws:SourceArn and aws:SourceAccount")
    return problems


def check_policy_json(path, template):
    """The standalone policy: the same checks, and the template's consumer actions per Sid."""
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    problems = []
    for stmt in statements(document):
        problems += statement_problems(stmt, path)
    ours = {s.get("Sid"): sorted(as_list(s["Action"])) for s in statements(document)}
    for role in instance_roles(template):
        for name, doc in attached_policies(template, role):
            for s in statements(doc):
                sid = s.get("Sid")
                if ours.get(sid) != sorted(as_list(s["Action"])):
                    problems.append(f"{path}: {sid} is {ours.get(sid)}, the template's {name} grants {sorted(as_list(s['Action']))}")
    return problems


# ---- self-test: each check catches its own breakage ----------------------------------------

def consumer_statements(t):
    role = sorted(instance_roles(t))[0]
    return t["Resources"][role]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]


def first(stmts, sid):
    return next(s for s in stmts if isinstance(s, dict) and s.get("Sid") == sid)


def find_sid(stmts, sid):
    return next(b for s in stmts for b in branches(s) if b.get("Sid") == sid)


def producer_name(t):
    return next(iter(resources_of(t, "AWS::IAM::ManagedPolicy")))


def mutations():
    def add_send(t):
        first(consumer_statements(t), "ConsumeJobs")["Action"].append("sqs:SendMessage")

    def add_sqs_star(t):
        first(consumer_statements(t), "ConsumeJobs")["Action"] = "sqs:*"

    def star_resource(t):
        first(consumer_statements(t), "ReadInputs")["Resource"] = "*"

    def drop_namespace(t):
        del first(consumer_statements(t), "PublishMetrics")["Condition"]

    def kms_everywhere(t):
        find_sid(consumer_statements(t), "UseKey")["Resource"] = "*"

    def kms_on_bucket(t):
        find_sid(consumer_statements(t), "UseKey")["Resource"] = {"Fn::GetAtt": ["InputBucket", "Arn"]}

    def attach_producer(t):
        role = sorted(instance_roles(t))[0]
        t["Resources"][role]["Properties"].setdefault("ManagedPolicyArns", []).append(
            {"Ref": producer_name(t)}
        )

    def producer_lists_role(t):
        role = sorted(instance_roles(t))[0]
        t["Resources"][producer_name(t)]["Properties"]["Roles"] = [{"Ref": role}]

    def no_producer(t):
        del t["Resources"][producer_name(t)]

    def low_redrive(t):
        t["Parameters"]["MaxReceiveCount"]["MinValue"] = 2

    def literal_low_redrive(t):
        t["Resources"]["JobQueue"]["Properties"]["RedrivePolicy"]["maxReceiveCount"] = 1

    def no_tls_deny(t):
        doc = t["Resources"]["ResultsBucketPolicy"]["Properties"]["PolicyDocument"]
        doc["Statement"] = [s for s in doc["Statement"] if s.get("Sid") != "DenyInsecureTransport"]

    def no_kms_deny(t):
        doc = t["Resources"]["InputBucketPolicy"]["Properties"]["PolicyDocument"]
        doc["Statement"] = [
            s for s in doc["Statement"] if "DenyPutWithoutKms" not in json.dumps(s)
        ]

    def open_queue_policy(t):
        doc = t["Resources"]["JobQueuePolicy"]["Properties"]["PolicyDocument"]
        del first(doc["Statement"], "InputBucketNotifies")["Condition"]

    return [
        (add_send, "must not send messages"),
        (add_sqs_star, "wildcard action sqs:*"),
        (star_resource, 'Resource "*" for'),
        (drop_namespace, "without a cloudwatch:namespace condition"),
        (kms_everywhere, "not only on the key"),
        (kms_on_bucket, "not only on the key"),
        (attach_producer, "is attached to instance role"),
        (producer_lists_role, "is attached to instance role"),
        (no_producer, "no producer managed policy"),
        (low_redrive, "maxReceiveCount can be below 3"),
        (literal_low_redrive, "maxReceiveCount can be below 3"),
        (no_tls_deny, "ResultsBucket: no bucket policy denies non-TLS"),
        (no_kms_deny, "InputBucket: no bucket policy denies PutObject without SSE-KMS"),
        (open_queue_policy, "without aws:SourceArn"),
    ]


def self_test(template):
    baseline = check_template(template)
    if baseline:
        return [f"the template itself fails: {baseline}"]
    failures = []
    for mutate, expected in mutations():
        broken = copy.deepcopy(template)
        mutate(broken)
        found = check_template(broken)
        if not any(expected in p for p in found):
            failures.append(f"{mutate.__name__}: expected a problem containing {expected!r}, got {found}")
        else:
            print(f"caught {mutate.__name__}: {[p for p in found if expected in p][0]}")
    return failures


# ---- deploy into moto ----------------------------------------------------------------------

def evaluate_condition(expr, params, conditions):
    """Fn::Equals/Not/And/Or over parameters, for the Fn::If resolution below."""
    if isinstance(expr, dict):
        (fn, arg), = expr.items()
        if fn == "Ref":
            return params[arg]
        if fn == "Condition":
            return evaluate_condition(conditions[arg], params, conditions)
        if fn == "Fn::Equals":
            a, b = (evaluate_condition(x, params, conditions) for x in arg)
            return str(a) == str(b)
        if fn == "Fn::Not":
            return not evaluate_condition(arg[0], params, conditions)
        if fn == "Fn::And":
            return all(evaluate_condition(x, params, conditions) for x in arg)
        if fn == "Fn::Or":
            return any(evaluate_condition(x, params, conditions) for x in arg)
        raise ValueError(f"condition function {fn}")
    return expr


def resolve_ifs_in_lists(node, truth):
    """moto keeps `!If [c, x, !Ref AWS::NoValue]` inside a list as a null element (CloudFormation
    drops it), which e.g. makes IAM reject the policy. Resolve list-level Fn::If for this deploy's
    parameter values; moto handles the other Fn::If itself."""
    if isinstance(node, dict) and set(node) == {"Fn::If"}:
        cond, yes, no = node["Fn::If"]
        return {"Fn::If": [cond, resolve_ifs_in_lists(yes, truth), resolve_ifs_in_lists(no, truth)]}
    if isinstance(node, dict):
        return {k: resolve_ifs_in_lists(v, truth) for k, v in node.items()}
    if isinstance(node, list):
        out = []
        for item in node:
            while isinstance(item, dict) and set(item) == {"Fn::If"}:
                cond, yes, no = item["Fn::If"]
                item = yes if truth[cond] else no
            if item != NO_VALUE:
                out.append(resolve_ifs_in_lists(item, truth))
        return out
    return node


def resolve_value(value, params, outputs):
    """Ref to a parameter and Fn::GetAtt JobQueue.Arn (via the stack output): enough for the
    notification configuration moto's CloudFormation leaves out."""
    if isinstance(value, dict) and "Ref" in value:
        return params[value["Ref"]]
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return outputs["{}{}".format(*value["Fn::GetAtt"])]
    if isinstance(value, dict):
        return {k: resolve_value(v, params, outputs) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_value(v, params, outputs) for v in value]
    return value


def moto_copy(template, params, test_ami_parameter):
    t = copy.deepcopy(template)
    present = {r["Type"] for r in t["Resources"].values()}
    stale = MOTO_LACKS - present
    if stale:
        raise SystemExit(f"MOTO_LACKS names types the template no longer has: {stale}")
    # Anything else moto cannot create would be skipped with only a log line: fail instead.
    for module in ("autoscaling", "cloudwatch", "ec2", "iam", "logs", "s3", "sns", "sqs", "ssm"):
        importlib.import_module(f"moto.{module}.models")
    from moto.cloudformation.parsing import get_model_map

    unknown = present - MOTO_LACKS - set(get_model_map())
    if unknown:
        raise SystemExit(f"moto cannot create {unknown}: add them to MOTO_LACKS or drop them")
    removed = sorted(k for k, r in t["Resources"].items() if r["Type"] in MOTO_LACKS)
    for name in removed:
        del t["Resources"][name]
    for res in t["Resources"].values():
        deps = [d for d in as_list(res.get("DependsOn", [])) if d not in removed]
        if deps:
            res["DependsOn"] = deps
        else:
            res.pop("DependsOn", None)
    # moto resolves an SSM-typed parameter's Default even when a value is passed, and its SSM
    # has no Deep Learning AMI parameter (nor may one create names under /aws/).
    t["Parameters"]["ImageId"]["Default"] = test_ami_parameter
    values = {k: str(p.get("Default", "")) for k, p in t["Parameters"].items()}
    values.update(params)
    conditions = t.get("Conditions", {})
    truth = {c: evaluate_condition(e, values, conditions) for c, e in conditions.items()}
    return resolve_ifs_in_lists(t, truth), removed, values, truth


def template_metrics(template, namespace):
    """(metric, {dimension: value}) of the dispatcher's namespace that alarms and the dashboard
    read, so the test can hold them against what the dispatcher really publishes."""
    found = []
    for alarm in resources_of(template, "AWS::CloudWatch::Alarm").values():
        for m in alarm["Properties"].get("Metrics", []):
            metric = m.get("MetricStat", {}).get("Metric")
            if metric and metric["Namespace"] == {"Ref": "MetricsNamespace"}:
                dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
                found.append([metric["MetricName"], dims])
    for dash in resources_of(template, "AWS::CloudWatch::Dashboard").values():
        text, _ = dash["Properties"]["DashboardBody"]["Fn::Sub"]
        text = text.replace("${Namespace}", namespace)
        body = json.loads(re.sub(r"\$\{[^}]+\}", "x", text))
        for widget in body["widgets"]:
            for row in widget["properties"].get("metrics", []):
                names = [x for x in row if isinstance(x, str)]
                if names and names[0] == namespace:
                    found.append([names[1], dict(zip(names[2::2], names[3::2]))])
    unique = []
    for entry in found:
        if entry not in unique:
            unique.append(entry)
    return unique


def deploy(args):
    import boto3

    template = load(args.template)
    kw = dict(
        endpoint_url=args.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    ec2, ssm, cfn = (boto3.client(s, **kw) for s in ("ec2", "ssm", "cloudformation"))
    s3, sqs = boto3.client("s3", **kw), boto3.client("sqs", **kw)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24")["Subnet"]["SubnetId"]
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ami_parameter = f"/test/{args.stack}/gpu-ami"
    ssm.put_parameter(Name=ami_parameter, Value=ami, Type="String", DataType="aws:ec2:image")
    params = {
        "NamePrefix": args.stack,
        "VpcId": vpc,
        "SubnetIds": subnet,
        "ImageId": ami_parameter,
        "ContainerImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/parakeet:test",
        "ModelBucket": f"{args.stack}-models",
    }
    body, removed, values, truth = moto_copy(template, params, ami_parameter)
    cfn.create_stack(
        StackName=args.stack,
        TemplateBody=json.dumps(body),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()],
        Capabilities=["CAPABILITY_NAMED_IAM"],
    )
    stack = cfn.describe_stacks(StackName=args.stack)["Stacks"][0]
    if stack["StackStatus"] != "CREATE_COMPLETE":
        raise SystemExit(f"stack {stack['StackStatus']}: {stack.get('StackStatusReason')}")
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack["Outputs"]}
    resources = {
        r["LogicalResourceId"]: r["ResourceType"]
        for r in cfn.describe_stack_resources(StackName=args.stack)["StackResources"]
    }
    bucket = outputs["InputBucketName"]

    # moto's CloudFormation creates the bucket with its encryption only: it drops
    # NotificationConfiguration (and the lifecycle and public-access-block settings). Apply
    # the template's own notification configuration through the S3 API.
    notification_applied_by_cfn = bool(
        s3.get_bucket_notification_configuration(Bucket=bucket).get("QueueConfigurations")
    )
    props = body["Resources"]["InputBucket"]["Properties"]
    if not notification_applied_by_cfn:
        config = resolve_value(props["NotificationConfiguration"], values, {"JobQueueArn": outputs["JobQueueArn"]})
        queue_configs = [
            {
                "QueueArn": q["Queue"],
                "Events": [q["Event"]],
                "Filter": {"Key": {"FilterRules": q["Filter"]["S3Key"]["Rules"]}},
            }
            for q in config["QueueConfigurations"]
        ]
        s3.put_bucket_notification_configuration(
            Bucket=bucket, NotificationConfiguration={"QueueConfigurations": queue_configs}
        )
    encryption = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]
    sse = encryption["Rules"][0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"]

    # Drop the s3:TestEvent S3 sends when notifications are configured (the dispatcher would
    # ignore it, but the assertions below count messages).
    queue_url = outputs["JobQueueUrl"]
    sqs.purge_queue(QueueUrl=queue_url)
    prefix = values["InputPrefix"]
    uploads = {}
    for path, name in ((args.clip, "clip.wav"), (args.bad, "not-audio.wav")):
        key = f"{prefix}{args.stack}/{name}"
        with open(path, "rb") as f:
            s3.put_object(Bucket=bucket, Key=key, Body=f.read())
        uploads[name] = key
    # Outside the prefix: no job.
    s3.put_object(Bucket=bucket, Key=f"elsewhere/{args.stack}.wav", Body=b"not a job")

    notified = []
    deadline = time.time() + 10
    while len(notified) < 2 and time.time() < deadline:
        got = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0, WaitTimeSeconds=1
        )
        for m in got.get("Messages", []):
            for record in json.loads(m["Body"]).get("Records", []):
                entry = (record["eventName"], record["s3"]["bucket"]["name"], record["s3"]["object"]["key"])
                if entry not in notified:
                    notified.append(entry)
    attrs = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]

    # What the nodes would get: the launch template (its user data writes dispatcher.toml) and
    # the group. moto's CloudFormation drops the group's CapacityRebalance, lifecycle hooks and
    # MetricsCollection; they are reported, not asserted.
    asg_client = boto3.client("autoscaling", **kw)
    lt = ec2.describe_launch_template_versions(LaunchTemplateName=f"{args.stack}-gpu")
    lt_data = lt["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    user_data = base64.b64decode(lt_data.pop("UserData")).decode()
    toml = user_data.split("<<'EOF'\n", 1)[1].split("\nEOF\n", 1)[0]
    group = asg_client.describe_auto_scaling_groups(
        AutoScalingGroupNames=[outputs["AutoScalingGroupName"]]
    )["AutoScalingGroups"][0]
    hooks = asg_client.describe_lifecycle_hooks(AutoScalingGroupName=group["AutoScalingGroupName"])
    print(
        json.dumps(
            {
                "outputs": outputs,
                "resources": resources,
                "removed": removed,
                "removed_types": sorted(MOTO_LACKS),
                "conditions": truth,
                "notification_applied_by_cfn": notification_applied_by_cfn,
                "input_sse": sse,
                "uploads": uploads,
                "notified": notified,
                "queue_attributes": attrs,
                "launch_template": lt_data,
                "user_data": user_data,
                "dispatcher_toml": toml,
                "group": {
                    "MixedInstancesPolicy": group.get("MixedInstancesPolicy"),
                    "MinSize": group["MinSize"],
                    "MaxSize": group["MaxSize"],
                    "HealthCheckGracePeriod": group.get("HealthCheckGracePeriod"),
                    "CapacityRebalance": group.get("CapacityRebalance"),
                    "EnabledMetrics": group.get("EnabledMetrics"),
                    "LifecycleHooks": hooks.get("LifecycleHooks", []),
                },
                "template_metrics": template_metrics(template, values["MetricsNamespace"]),
            },
            indent=1,
        )
    )


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check")
    check.add_argument("template")
    check.add_argument("--policy-json")
    st = sub.add_parser("self-test")
    st.add_argument("template")
    dep = sub.add_parser("deploy")
    dep.add_argument("template")
    dep.add_argument("--endpoint", required=True)
    dep.add_argument("--stack", required=True)
    dep.add_argument("--clip", required=True)
    dep.add_argument("--bad", required=True)
    args = parser.parse_args()
    if args.command == "deploy":
        deploy(args)
        return 0
    template = load(args.template)
    if args.command == "check":
        problems = check_template(template)
        if args.policy_json:
            problems += check_policy_json(args.policy_json, template)
    else:
        problems = self_test(template)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
