// typescript-eslint strictTypeChecked: it catches floating promises, the main bug class in
// socket-heavy code. Tests get a few relaxations that only make sense for assertions.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/**', '.tools/**', '.asb/**', '.venv/**', 'bench/results/**', 'test-artifacts/**', 'eslint.config.js', '.scratch/**'] },
  js.configs.recommended,
  ...tseslint.configs.strictTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/restrict-template-expressions': ['error', { allowNumber: true, allowBoolean: true }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
      '@typescript-eslint/no-confusing-void-expression': 'off',
    },
  },
  {
    // The web console: plain browser ES modules, no build step and no types, so no type-aware rules.
    files: ['src/console/**/*.js'],
    ...tseslint.configs.disableTypeChecked,
    languageOptions: {
      ...tseslint.configs.disableTypeChecked.languageOptions,
      sourceType: 'module',
      globals: Object.fromEntries(['document', 'location', 'sessionStorage', 'fetch', 'WebSocket', 'TextEncoder', 'URL', 'confirm', 'setInterval', 'clearInterval'].map((name) => [name, 'readonly'])),
    },
  },
  {
    files: ['test/**/*.ts', 'bench/**/*.ts'],
    rules: {
      '@typescript-eslint/no-non-null-assertion': 'off',
      // Test helpers return parsed JSON typed by the caller: `api<View>(...)`.
      '@typescript-eslint/no-unnecessary-type-parameters': 'off',
      '@typescript-eslint/no-floating-promises': ['error', { allowForKnownSafeCalls: [{ from: 'package', package: 'node:test', name: ['test', 'it', 'describe', 'suite'] }] }],
    },
  },
);
