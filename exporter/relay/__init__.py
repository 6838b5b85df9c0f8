"""The webhook relay: Alertmanager notifications to Slack, PagerDuty, chat robots and webhooks.

Alertmanager posts its webhook payload; the relay commits it to an on-disk queue
before answering 200, then a worker per target delivers it, with retries,
rate limits and digests, so that one slow target never delays another.
"""
