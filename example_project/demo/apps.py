from django.apps import AppConfig
from django.conf import settings
from django.core import checks


class DemoConfig(AppConfig):
    name = "demo"
    verbose_name = "Example project"

    def ready(self) -> None:
        # A deployment check: `check --deploy` reports it, everyday commands stay quiet.
        checks.register(check_secret_key, checks.Tags.security, deploy=True)


def check_secret_key(app_configs=None, **kwargs):  # type: ignore[no-untyped-def]
    from example.settings import DEVELOPMENT_SECRET_KEY

    if settings.SECRET_KEY == DEVELOPMENT_SECRET_KEY:
        return [
            checks.Warning(
                "SECRET_KEY is the example project's development default.",
                hint="Set the SECRET_KEY environment variable before exposing this server.",
                id="demo.W001",
            )
        ]
    return []
