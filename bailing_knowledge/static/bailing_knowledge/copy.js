// A "Copy" button copies the value of the field its data-copy-target names.
"use strict";
document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-copy-target]");
  if (!button) {
    return;
  }
  const field = document.getElementById(button.dataset.copyTarget);
  field.select();
  const copied = () => { button.textContent = "Copied"; };
  const fallback = () => {
    if (document.execCommand("copy")) {
      copied();
    }
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(field.value).then(copied, fallback);
  } else {
    fallback();
  }
});
