"""Checks that make a publishing run fail in seconds rather than after hours of conversion:
the target is a repo id, uploads are allowed, a token is present, the Hub takes it, and its
account may write to the target's namespace. Each failure is one line naming the fix."""

from __future__ import annotations

from ..errors import HubError
from ..version import __version__
from .common import LIBRARY, brief, endpoint, hub_url, is_offline, is_repo_id, transport_errors

# Token roles that cannot write (fine-grained tokens are checked by the Hub at upload)
READ_ONLY = {"read"}


def check_target(repo_id: str) -> str:
    """Raise HubError unless a push to `repo_id` can succeed as far as can be known before
    uploading anything; returns the token's account name."""
    if not is_repo_id(repo_id):
        raise HubError(f"{repo_id}: not a Hub repo id; push to org/name")
    if is_offline():
        raise HubError(f"{repo_id}: HF_HUB_OFFLINE=1 forbids uploading; run without it to push")
    from huggingface_hub import HfApi, get_token
    from huggingface_hub import errors as he

    if get_token() is None:
        raise HubError(
            f"{repo_id}: pushing needs a Hugging Face token with write access; log in with "
            "`hf auth login` or set HF_TOKEN"
        )
    api = HfApi(endpoint=endpoint(), library_name=LIBRARY, library_version=__version__)
    try:
        who = api.whoami()
    except he.HfHubHTTPError as e:
        code = getattr(getattr(e, "response", None), "status_code", None)
        if code == 401:
            raise HubError(
                f"{repo_id}: the Hub refused the token (401 Unauthorized); log in again with "
                "`hf auth login` or set a valid HF_TOKEN"
            ) from None
        raise HubError(
            f"{repo_id}: the Hub answered HTTP {code} when asked whose token this is "
            f"({brief(e)}); try again later"
        ) from None
    except transport_errors() as e:
        raise HubError(
            f"{repo_id}: cannot reach the Hub at {hub_url(repo_id)} ({type(e).__name__}: "
            f"{brief(e)}); check the network and proxy, then run again"
        ) from None
    name = str(who.get("name") or "")
    role = ((who.get("auth") or {}).get("accessToken") or {}).get("role")
    if role in READ_ONLY:
        raise HubError(
            f"{repo_id}: the token of {name or 'this account'} is read-only; use a token with "
            "write access (`hf auth login` or HF_TOKEN)"
        )
    namespace = repo_id.split("/")[0]
    orgs = {str(o.get("name")) for o in who.get("orgs") or [] if isinstance(o, dict)}
    if namespace != name and namespace not in orgs:
        mine = ", ".join(sorted({name, *orgs} - {""})) or "none"
        raise HubError(
            f"{repo_id}: the token's account {name or '?'} cannot create repos in {namespace} "
            f"(its namespaces: {mine}); push to one of them, or use a token of a member of "
            f"{namespace}"
        )
    return name
