// Starting an agent: a picker of the definitions the assembly registers, and a form built from
// the chosen one's inputs schema (GET /v1/definitions). What the server refuses is shown at
// the form, field by field where its problem document names the field ($.inputs... or $.NAME).

import { safeJson, safeText } from "./display.js";
import { el } from "./dom.js";

const $ = (id) => document.getElementById(id);

/** The picker and its form; `definitions` is GET /v1/definitions. */
export class StartForm {
  constructor() {
    this.definitions = new Map();
    $("start-definition").addEventListener("change", () => this.build());
  }

  /** Fill the picker (keeping the choice, and what was typed when the definition is the same). */
  load(definitions) {
    const picker = $("start-definition");
    const chosen = picker.value;
    const before = JSON.stringify([...this.definitions.values()]);
    this.definitions = new Map(definitions.filter((d) => d && typeof d.name === "string").map((d) => [d.name, d]));
    if (JSON.stringify([...this.definitions.values()]) === before && picker.options.length) return;
    const options = [...this.definitions.values()].map((d) => {
      const option = el("option", "", safeText(d.name));
      option.value = d.name;
      if (d.error) option.textContent = `${safeText(d.name)} (cannot be read)`;
      return option;
    });
    picker.replaceChildren(...options);
    $("start-empty").hidden = options.length > 0;
    $("start-form").hidden = options.length === 0;
    if (chosen && this.definitions.has(chosen)) picker.value = chosen;
    this.build();
  }

  /** Build the fields of the chosen definition's inputs. */
  build() {
    const definition = this.definitions.get($("start-definition").value);
    const about = $("start-about");
    const fields = $("start-inputs");
    this.clearErrors();
    if (!definition) {
      about.textContent = "";
      fields.replaceChildren();
      return;
    }
    const facts = [];
    if (definition.description) facts.push(safeText(definition.description, { multiline: true }));
    if (definition.model) facts.push(`model ${safeText(definition.model)}`);
    if (definition.tools?.length) facts.push(`tools ${definition.tools.map((t) => safeText(t)).join(", ")}`);
    if (definition.error) facts.push(`cannot be read: ${safeText(definition.error)}`);
    about.textContent = facts.join(" · ");
    const schema = definition.inputs ?? {};
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const properties = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
    fields.replaceChildren(...Object.entries(properties).map(([name, prop]) => this.field(name, prop ?? {}, required.has(name))));
  }

  field(name, prop, required) {
    const row = el("div", "field");
    row.dataset.input = name;
    const id = `input-${name}`;
    const label = el("label", "", safeText(name));
    label.htmlFor = id;
    if (required) label.append(el("span", "required", " *"));
    const type = typeof prop.type === "string" ? prop.type : "string";
    label.append(el("span", "type", ` ${safeText(type)}`));
    row.append(label);
    let control;
    if (Array.isArray(prop.enum)) {
      control = el("select");
      if (!required) control.append(Object.assign(el("option", "", "—"), { value: "" }));
      for (const choice of prop.enum) {
        const option = el("option", "", safeText(typeof choice === "string" ? choice : JSON.stringify(choice)));
        option.value = JSON.stringify(choice);
        control.append(option);
      }
      if (prop.default !== undefined) control.value = JSON.stringify(prop.default);
    } else if (type === "boolean") {
      control = el("input");
      control.type = "checkbox";
      control.checked = prop.default === true;
    } else if (type === "object" || type === "array") {
      control = el("textarea");
      control.rows = 2;
      control.spellcheck = false;
      control.placeholder = type === "object" ? "{ } as JSON" : "[ ] as JSON";
      if (prop.default !== undefined && prop.default !== null) control.value = safeJson(prop.default, 0);
    } else {
      control = el("input");
      control.type = type === "integer" || type === "number" ? "number" : "text";
      if (type === "integer") control.step = "1";
      if (type === "number") control.step = "any";
      if (prop.default !== undefined && prop.default !== null) control.value = String(prop.default);
    }
    control.id = id;
    control.name = name;
    control.dataset.type = type;
    control.dataset.enum = Array.isArray(prop.enum) ? "1" : "";
    if (required && type !== "boolean") control.required = true;
    row.append(control);
    if (prop.description) row.append(el("div", "hint", safeText(prop.description, { multiline: true })));
    row.append(el("div", "field-error"));
    return row;
  }

  /**
   * Return the body of POST /v1/instances from the form, or null after marking the fields whose
   * value is not of their type (JSON that does not parse, a number that is not one).
   */
  body() {
    this.clearErrors();
    const definition = $("start-definition").value;
    const inputs = {};
    let ok = true;
    for (const row of $("start-inputs").querySelectorAll(".field")) {
      const control = row.querySelector("input, select, textarea");
      const type = control.dataset.type;
      const name = row.dataset.input;
      if (control.dataset.enum) {
        if (control.value !== "") inputs[name] = JSON.parse(control.value);
        continue;
      }
      if (type === "boolean") {
        inputs[name] = control.checked;
        continue;
      }
      const text = control.value;
      if (text === "") continue; // left out: the server fills the default, or says it is required
      if (type === "integer" || type === "number") {
        const value = Number(text);
        if (!Number.isFinite(value) || (type === "integer" && !Number.isInteger(value))) {
          this.markError(name, `must be ${type === "integer" ? "a whole number" : "a number"}`);
          ok = false;
          continue;
        }
        inputs[name] = value;
      } else if (type === "object" || type === "array") {
        try {
          inputs[name] = JSON.parse(text);
        } catch {
          this.markError(name, `must be JSON (${type === "object" ? "an object" : "an array"})`);
          ok = false;
        }
      } else {
        inputs[name] = text;
      }
    }
    if (!ok) return null;
    const body = { definition, inputs };
    const prompt = $("start-prompt").value;
    if (prompt.trim()) body.prompt = prompt;
    return body;
  }

  markError(name, message) {
    const row = [...$("start-inputs").querySelectorAll(".field")].find((r) => r.dataset.input === name);
    if (!row) return false;
    row.classList.add("invalid");
    row.querySelector(".field-error").textContent = safeText(message);
    return true;
  }

  /** Show a refusal at the form: each error at its field when it names one, the rest below. */
  showProblem(problem) {
    this.clearErrors();
    const rest = [];
    for (const error of problem.errors ?? []) {
      const named = /^\$\.(?:inputs\.)?([A-Za-z_][A-Za-z0-9_]*)$/.exec(error.path);
      if (!(named && this.markError(named[1], error.message))) rest.push(error.message);
    }
    const box = $("start-error");
    const head = `${problem.status ? `${problem.status} ` : ""}${safeText(problem.title)}`;
    box.replaceChildren(el("strong", "", head));
    if (problem.detail) box.append(el("span", "", ` ${safeText(problem.detail, { multiline: true })}`));
    if (rest.length) {
      const list = el("ul");
      rest.forEach((message) => list.append(el("li", "", safeText(message, { multiline: true }))));
      box.append(list);
    }
    box.hidden = false;
  }

  clearErrors() {
    $("start-error").hidden = true;
    $("start-error").replaceChildren();
    for (const row of $("start-inputs").querySelectorAll(".field.invalid")) {
      row.classList.remove("invalid");
      row.querySelector(".field-error").textContent = "";
    }
  }

  /** After a start: the prompt is cleared, the inputs are kept (to start another like it). */
  started() {
    $("start-prompt").value = "";
    this.clearErrors();
  }
}
