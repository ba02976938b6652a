// Starts Swagger UI on /docs (a file rather than an inline script: the page's
// Content-Security-Policy allows scripts from this origin only).
"use strict";
const node = document.getElementById("swagger-ui");
window.ui = SwaggerUIBundle({
  url: node.dataset.openapiUrl,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
