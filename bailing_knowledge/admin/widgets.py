"""Widgets the admin's own forms need and Django does not offer as such."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.utils.html import format_html


class WrappedSelectMultiple(FilteredSelectMultiple):
    """The two-pane selector in a box of its own, as the admin wraps its own selectors.

    The selector's script moves its panes to the front of the widget's parent element; on
    a plain form that parent also holds the label, which would end up right of the panes.
    """

    def render(self, *args: Any, **kwargs: Any) -> str:
        return format_html(
            '<div class="related-widget-wrapper">{}</div>', super().render(*args, **kwargs)
        )


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True
