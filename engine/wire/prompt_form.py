"""The prompt form the default model answers by repeating the text: canaries, the
demo load, reproduction workloads and the black-box probe all use it, so whatever text
crosses between requests comes back readable. Plain data, importable from the GUI."""

PROMPT_FORM = "{text}\n\nRepeat the text above exactly:\n"
