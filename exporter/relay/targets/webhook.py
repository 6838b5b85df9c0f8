"""Generic webhook: Alertmanager's JSON as received, or a user template, signed.

Headers: ``X-Gpuload-Timestamp`` (unix seconds when sent), ``X-Gpuload-Dedup-Key``
(the same for re-deliveries of one notification, so receivers can drop
duplicates) and, with a secret, ``X-Gpuload-Signature: t=<unix>,v1=<hex>``,
the HMAC-SHA256 of ``<unix>.<body>`` keyed with the secret. Signing the time
with the body (Slack's and Stripe's scheme) lets a receiver refuse a captured
request replayed later: it checks the signature, then that ``t`` is recent.
The body is Alertmanager's JSON as received, so it is no larger than what the
relay accepted (``web.max_body_bytes``); no service limit applies.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from exporter.relay.payload import Notification
from exporter.relay.target_config import Secret, option
from exporter.relay.targets.base import OutboundRequest, Target, register


def signature(secret: str, body: bytes, timestamp: int) -> str:
    """The value of X-Gpuload-Signature: ``t=<unix>,v1=<hex HMAC-SHA256 of "t.body">``."""
    signed = f"{timestamp}.".encode() + body
    return f"t={timestamp},v1={hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()}"


@dataclass(frozen=True)
class WebhookOptions:
    """What a generic webhook takes besides the shared settings."""

    secret: Secret | None = option(
        secret=True, help="signs each request: the X-Gpuload-Signature header"
    )
    content_type: str = option(
        default="application/json", help="the Content-Type header, for a template's text"
    )


@register
class Webhook(Target):
    """Any HTTP endpoint taking Alertmanager's webhook JSON."""

    kind = "webhook"
    options_type = WebhookOptions
    options: WebhookOptions
    digests = False

    def request(self, notifications: Sequence[Notification], now: float) -> OutboundRequest:
        """The notification's JSON (or the template's output), signed when a secret is set."""
        notification = notifications[0]
        custom = self.user_text(notification)
        body = (custom if custom is not None else notification.to_json()).encode()
        stamp = int(now)
        headers = {
            "Content-Type": self.options.content_type,
            "X-Gpuload-Timestamp": str(stamp),
            "X-Gpuload-Dedup-Key": notification.dedup_key(),
        }
        if self.options.secret is not None:
            headers["X-Gpuload-Signature"] = signature(self.options.secret.value, body, stamp)
        return OutboundRequest(self.url, body, headers)
