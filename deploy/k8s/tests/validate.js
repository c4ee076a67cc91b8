// Validates Kubernetes objects offline against the API schemas.
//
//   node validate.js < objects.json     (a JSON array of objects)
//
// Each object is checked twice:
//  - by the JSON schema of its kind from the npm package kubernetes-models
//    (types, required fields, formats such as quantities and enums), or,
//    for the Prometheus Operator's kinds (monitoring.coreos.com: PodMonitor,
//    PrometheusRule), from @kubernetes-models/prometheus-operator;
//  - strictly, as `kubectl apply` does by default (field validation
//    "Strict"): a field the API does not define is an error. The schemas of
//    kubernetes-models accept unknown fields, so the known ones are read
//    from the package's TypeScript declarations of the same API version.
// Prints one line per problem ("<kind>/<name>: <path>: <what>") and exits 1
// if there is any, 2 on a usage error.
"use strict";

const fs = require("fs");
const path = require("path");

function modulePathFor(apiVersion, kind) {
  // "v1" -> kubernetes-models/v1; "apps/v1" -> kubernetes-models/apps/v1;
  // the Prometheus Operator's CRDs from their own package.
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return `@kubernetes-models/prometheus-operator/${apiVersion}/${kind}`;
  }
  return `kubernetes-models/${apiVersion}/${kind}`;
}

// --- strict field check from the .d.ts declarations -----------------------

const interfaceCache = new Map();

function stripComments(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
}

// Splits `body` at `sep` characters that are not nested in <>, {}, (), [].
function splitTopLevel(body, sep) {
  const parts = [];
  let depth = 0;
  let cur = "";
  for (const ch of body) {
    if ("<{([".includes(ch)) depth++;
    if (">})]".includes(ch)) depth--;
    if (ch === sep && depth === 0) {
      parts.push(cur);
      cur = "";
    } else {
      cur += ch;
    }
  }
  if (cur.trim() !== "") parts.push(cur);
  return parts;
}

// The first exported interface of a declaration file: {props: Map(name ->
// type text), imports: Map(name -> file)}; null if it declares none (a type
// alias such as IntOrString or Quantity: a leaf).
function loadInterface(dtsFile) {
  if (interfaceCache.has(dtsFile)) return interfaceCache.get(dtsFile);
  const text = stripComments(fs.readFileSync(dtsFile, "utf8"));
  const imports = new Map();
  for (const m of text.matchAll(/import \{ (\w+) \} from "([^"]+)";/g)) {
    imports.set(m[1], resolveDts(m[2], path.dirname(dtsFile)));
  }
  const head = /export interface \w+(?: extends [\w, ]+)? \{/.exec(text);
  let result = null;
  if (head) {
    let depth = 1;
    let i = head.index + head[0].length;
    const start = i;
    for (; i < text.length && depth > 0; i++) {
      if (text[i] === "{") depth++;
      if (text[i] === "}") depth--;
    }
    const body = text.slice(start, i - 1);
    const props = new Map();
    for (const member of splitTopLevel(body, ";")) {
      const m = /^\s*"([^"]+)"\??:\s*([\s\S]+)$/.exec(member);
      if (m) props.set(m[1], m[2].replace(/\s+/g, " ").trim());
    }
    result = { props, imports };
  }
  interfaceCache.set(dtsFile, result);
  return result;
}

// The declaration file beside the module that `spec` names (the packages'
// export maps name only their .js files).
// (Relative imports may name the .js file: "./PodMonitorSpec.js". A
// package is resolved from the importing file's folder, which finds the
// version that package depends on.)
function resolveDts(spec, fromDir) {
  if (spec.startsWith(".")) {
    return path.join(fromDir, spec.replace(/\.js$/, "") + ".d.ts");
  }
  return require.resolve(spec, { paths: [fromDir, __dirname] })
    .replace(/\.js$/, ".d.ts");
}

function checkUnknown(value, typeText, iface, where, problems) {
  if (value === null || value === undefined) return;
  let m;
  if ((m = /^Array<(.+)>$/.exec(typeText))) {
    if (Array.isArray(value)) {
      value.forEach((v, i) =>
        checkUnknown(v, m[1], iface, `${where}/${i}`, problems));
    }
    return;
  }
  if ((m = /^\{ \[key: string\]: (.+?);? \}$/.exec(typeText))) {
    if (typeof value === "object") {
      for (const [k, v] of Object.entries(value)) {
        checkUnknown(v, m[1], iface, `${where}/${k}`, problems);
      }
    }
    return;
  }
  if (iface.imports.has(typeText)) {
    checkObject(value, iface.imports.get(typeText), where, problems);
  }
}

function checkObject(value, dtsFile, where, problems) {
  if (typeof value !== "object" || Array.isArray(value)) return;
  const iface = loadInterface(dtsFile);
  if (iface === null) return;
  for (const [key, v] of Object.entries(value)) {
    if (!iface.props.has(key)) {
      problems.push(`${where}/${key}: unknown field "${key}"`);
      continue;
    }
    checkUnknown(v, iface.props.get(key), iface, `${where}/${key}`, problems);
  }
}

// --- main -------------------------------------------------------------------

function validateAll(objects) {
  const problems = [];
  for (const obj of objects) {
    const id = `${obj && obj.kind}/${obj && obj.metadata && obj.metadata.name}`;
    if (!obj || typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
      problems.push(`${id}: no apiVersion or kind`);
      continue;
    }
    const mod = modulePathFor(obj.apiVersion, obj.kind);
    let Model;
    let dtsFile;
    try {
      Model = require(mod)[obj.kind];
      dtsFile = resolveDts(mod, __dirname);
    } catch (e) {
      problems.push(`${id}: unknown kind ${obj.kind} in ${obj.apiVersion}`);
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      for (const line of String(e.message).split(/, (?=data)/)) {
        problems.push(`${id}: ${line.replace(/^data/, "")}`);
      }
    }
    const unknown = [];
    checkObject(obj, dtsFile, "", unknown);
    for (const p of unknown) problems.push(`${id}: ${p}`);
  }
  return problems;
}

function main() {
  let objects;
  try {
    objects = JSON.parse(fs.readFileSync(0, "utf8"));
  } catch (e) {
    console.error(`validate.js: stdin is not a JSON array: ${e.message}`);
    process.exit(2);
  }
  if (!Array.isArray(objects)) {
    console.error("validate.js: stdin is not a JSON array");
    process.exit(2);
  }
  const problems = validateAll(objects);
  for (const p of problems) console.log(p);
  console.error(`validate.js: ${objects.length} objects, ${problems.length} problems`);
  process.exit(problems.length ? 1 : 0);
}

main();
